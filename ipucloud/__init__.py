"""ipucloud: the face of the cloud (CLI, Python SDK, the `up` supervisor).

import ipucloud

with ipucloud.Client() as c:  # URL and key from `ipucloud login` or IPUCLOUD_URL / IPUCLOUD_API_KEY
    job = c.submit_job(name="r50", model="resnet50", steps=100, ipus=4)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ipucloud.sdk import (
        ApiError,
        AsyncClient,
        AuthError,
        Client,
        ConflictError,
        InvalidRequestError,
        IpucloudError,
        Job,
        NotFoundError,
        OnnxModel,
        QuotaError,
        RateLimitError,
        RetryPolicy,
        ServerError,
        ServiceUnreachable,
        StreamEvent,
    )

__all__ = [
    "ApiError",
    "AsyncClient",
    "AuthError",
    "Client",
    "ConflictError",
    "InvalidRequestError",
    "IpucloudError",
    "Job",
    "NotFoundError",
    "OnnxModel",
    "QuotaError",
    "RateLimitError",
    "RetryPolicy",
    "ServerError",
    "ServiceUnreachable",
    "StreamEvent",
    "__version__",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use, so importing the package (e.g. for the supervisor) does not load httpx.
    if name in __all__:
        from ipucloud import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'ipucloud' has no attribute {name!r}")
