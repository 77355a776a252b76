"""Own models: a part of `Operations` (`_api.py`)."""

from __future__ import annotations

from ipucloud.sdk._core import Call, Pager, model, operation, paginated
from ipucloud.sdk._ops_common import V1, _page, seg
from ipucloud.sdk.models import OnnxModel, Page


class ModelOps:
    """The tenant's uploaded ONNX models (uploading is in `client.py`/`aclient.py`: it reads a file)."""

    @operation
    def list_models(self, *, limit: int = 100, cursor: str | None = None) -> Call[Page[OnnxModel]]:
        """One page of your tenant's uploaded models (`next_cursor` for the next)."""
        return Call("GET", f"{V1}/models", _page(OnnxModel), params={"limit": limit, "cursor": cursor})

    @paginated
    def iter_models(self, *, page_size: int = 100) -> Pager[OnnxModel]:
        """Every model your tenant uploaded, fetched page by page."""
        return lambda cursor: ModelOps.list_models.build(self, limit=page_size, cursor=cursor)

    @operation
    def get_model(self, ref: str) -> Call[OnnxModel]:
        """A model by id or name."""
        return Call("GET", f"{V1}/models/{seg(ref)}", model(OnnxModel))

    @operation
    def delete_model(self, ref: str) -> Call[OnnxModel]:
        """Remove a model (refused while queued or running jobs use it)."""
        return Call("DELETE", f"{V1}/models/{seg(ref)}", model(OnnxModel))
