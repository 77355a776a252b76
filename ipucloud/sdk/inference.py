"""Calling an inference endpoint from the SDK: arrays in, arrays out, in the Open Inference Protocol.

Any v2 client works against an endpoint's `url` (tritonclient, KServe's, MLServer's); this is the
SDK's own, so that a user of `Client` needs nothing more. Inputs go as binary tensors (the protocol's
binary tensor extension), which costs no JSON encoding of large arrays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

# numpy's dtypes by the protocol's datatype names (BF16 travels as its raw 16 bits).
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "INT8": np.int8,
    "UINT16": np.uint16,
    "INT16": np.int16,
    "FP16": np.float16,
    "UINT32": np.uint32,
    "INT32": np.int32,
    "FP32": np.float32,
    "UINT64": np.uint64,
    "INT64": np.int64,
    "FP64": np.float64,
}
_BY_DTYPE = {np.dtype(v): k for k, v in DATATYPES.items()}
HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Inference:
    """An endpoint's answer: its outputs by name, the replica and batch it ran in, and what the chip
    would have taken (`timing_ms`: queue, batch, host, ipu)."""

    model_name: str
    outputs: dict[str, np.ndarray]
    replica: int | None = None
    batch_size: int | None = None
    timing_ms: dict[str, float] = field(default_factory=dict)
    id: str | None = None

    @property
    def latency_ms(self) -> float:
        return sum(self.timing_ms.values())


def request(
    inputs: Mapping[str, Any], *, datatypes: Mapping[str, str] | None = None, request_id: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a v2 infer request: every input as binary data, outputs asked as binary."""
    tensors: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, value in inputs.items():
        wanted = (datatypes or {}).get(name)
        arr = np.ascontiguousarray(value, dtype=DATATYPES[wanted] if wanted else None)
        datatype = wanted or _BY_DTYPE.get(arr.dtype)
        if datatype is None:
            raise ValueError(f"input {name!r}: numpy dtype {arr.dtype} has no v2 datatype; pass `datatypes`")
        raw = arr.tobytes()
        tensors.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(arr.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    doc: dict[str, Any] = {"inputs": tensors, "parameters": {"binary_data_output": True}}
    if request_id is not None:
        doc["id"] = request_id
    head = orjson.dumps(doc)
    headers = {HEADER: str(len(head)), "Content-Type": "application/octet-stream"}
    return head + b"".join(blobs), headers


def parse(content: bytes, headers: Mapping[str, str]) -> Inference:
    """A v2 infer answer, JSON or JSON followed by binary outputs."""
    length = headers.get(HEADER) or headers.get(HEADER.lower())
    head, rest = (content[: int(length)], content[int(length) :]) if length else (content, b"")
    doc = orjson.loads(head)
    outputs: dict[str, np.ndarray] = {}
    offset = 0
    for out in doc.get("outputs", []):
        dtype = DATATYPES[out["datatype"]]
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            arr = np.frombuffer(rest[offset : offset + size], dtype=dtype).reshape(out["shape"])
            offset += size
        else:
            arr = np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
        outputs[out["name"]] = arr
    timing: dict[str, float] = {}
    for part in (headers.get("server-timing") or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        if name and dur:
            timing[name] = float(dur)
    params = doc.get("parameters") or {}
    return Inference(
        model_name=doc.get("model_name", ""),
        outputs=outputs,
        replica=params.get("replica"),
        batch_size=params.get("batch_size"),
        timing_ms=timing,
        id=doc.get("id"),
    )
