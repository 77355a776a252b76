"""Strip the weights out of an ONNX file without loading it: only the graph travels and is kept.

The emulator needs shapes, not values, so a model's weight data (ONNX initializers, ``Constant``
tensors and sparse tensors) can be dropped before upload: a 1.3 GB BERT-Large export becomes a graph of
a few hundred kilobytes. This module walks the protobuf wire format of ``ModelProto`` directly from a
seekable file, so a multi-gigabyte model is never read into memory: a tensor's data field is skipped
with a seek, everything else is copied. It needs nothing beyond the standard library, so the CLI and
SDK run it on the client before uploading, and the server runs it on what it streamed to disk.

A tensor keeps its data when it has at most ``KEEP_ELEMENTS`` elements: shape inference needs the values
of the small integer tensors a graph computes shapes from (``Reshape`` targets, ``Slice`` bounds), and
scalar constants cost nothing. A stripped tensor keeps its name, type and dimensions and is marked as
external data with the location ``STRIPPED_LOCATION``, which is what it now is.

Field numbers are those of ``onnx/onnx.proto`` (IR version 10 and earlier); fields this module does not
know are copied as they are. ``training_info`` (initialisation and training-step graphs of an ONNX
training model) is dropped: the emulator plans the inference graph and derives training from it. So are
nodes' ``doc_string`` and ``metadata_props``, an exporter's notes on where each node came from.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

KEEP_ELEMENTS = 256
"""Tensors with at most this many elements keep their values (shape arguments, scalar constants)."""
STRIPPED_LOCATION = "ipucloud:stripped"
MAX_FIELD_BYTES = 64 * 2**20
"""A kept field larger than this (a huge doc string, a graph of millions of nodes) is refused."""
_IN_MEMORY = 256 * 2**10  # sub-messages up to this size are read at once and walked in memory
MAX_DEPTH = 64
"""Messages within messages the walk follows (a subgraph in a node's attribute in a graph is three
deeper): real exports nest a few levels; 3,000 nested subgraphs would exhaust Python's stack."""
# ModelProto's fields and their wire types (onnx.proto): a file whose first field is none of them is
# not an ONNX model, whatever else it is.
_MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2, 26: 2}

# Message kinds and, for each, the length-delimited fields that are messages we walk into.
_MODEL, _GRAPH, _NODE, _ATTR, _TENSOR, _SPARSE, _FUNCTION = range(7)
_CHILDREN: dict[int, dict[int, int]] = {
    _MODEL: {7: _GRAPH, 25: _FUNCTION},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _NODE: {5: _ATTR},
    _ATTR: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
    _FUNCTION: {7: _NODE},
    _TENSOR: {},
}
# ModelProto.training_info; NodeProto.doc_string and metadata_props. The node fields are what an
# exporter says of itself (torch.onnx writes each node's Python stack trace and module path there:
# three quarters of a stripped transformer, and the user's own file paths): nothing the emulator
# reads, and leaving them out keys the executable cache on the computation, not on where it was
# exported from.
_DROPPED = {_MODEL: {20}, _NODE: {6, 9}}
# TensorProto: float_data, int32_data, string_data, int64_data, raw_data, double_data, uint64_data
_TENSOR_DATA = frozenset({4, 5, 6, 7, 9, 10, 11})
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_EXTERNAL, _TENSOR_LOCATION = 1, 2, 13, 14
_MODEL_GRAPH = 7


class StripError(ValueError):
    """The bytes are not a well-formed ONNX protobuf (or are cut short); ``offset`` is where it broke."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        self.offset = offset
        super().__init__(message if offset is None else f"{message} (at byte {offset:,})")


class GraphTooLarge(ValueError):
    """The graph without its weights is still larger than the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"the graph without its weights is larger than {limit:,} bytes")


@dataclass(frozen=True, slots=True)
class Stripped:
    """A model with its weight data removed, and what was removed."""

    data: bytes
    """The serialised ``ModelProto`` without weight data."""
    original_bytes: int
    tensors_stripped: int
    weight_bytes_removed: int
    external_tensors: int
    """Tensors whose data was already external (absent from the file) before stripping."""

    @property
    def digest(self) -> str:
        """SHA-256 of the stripped graph: the identity of the graph's content."""
        return hashlib.sha256(self.data).hexdigest()


class _Source:
    """Random access to the bytes being walked: a seekable file or a buffer."""

    def __init__(self, f: BinaryIO | None, buf: bytes | memoryview | None, size: int) -> None:
        self.f = f
        self.buf = buf
        self.size = size

    def read(self, pos: int, n: int) -> bytes:
        if self.buf is not None:
            return bytes(self.buf[pos : pos + n])
        assert self.f is not None
        self.f.seek(pos)
        return self.f.read(n)

    def varint(self, pos: int, end: int) -> tuple[int, int]:
        chunk = self.read(pos, min(10, end - pos))
        value = 0
        for i, byte in enumerate(chunk):
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                return value, pos + i + 1
        if len(chunk) < 10:
            raise StripError("truncated: the file ends inside a field header", pos)
        raise StripError("malformed protobuf: a varint longer than 10 bytes", pos)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@dataclass(slots=True)
class _Counts:
    stripped: int = 0
    removed: int = 0
    external: int = 0


class _Walker:
    def __init__(self, source: _Source, max_output: int | None) -> None:
        self.source = source
        self.max_output = max_output
        self.counts = _Counts()
        self.emitted = 0

    def _fields(self, start: int, end: int) -> list[tuple[int, int, int, int, int]]:
        """(field, wire type, header start, payload start, payload end) of every field in [start, end)."""
        out = []
        pos = start
        while pos < end:
            header = pos
            tag, pos = self.source.varint(pos, end)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                raise StripError("malformed protobuf: field number 0", header)
            if wire == 0:
                _, pos_after = self.source.varint(pos, end)
                out.append((field, wire, header, pos, pos_after))
                pos = pos_after
            elif wire == 1:
                out.append((field, wire, header, pos, pos + 8))
                pos += 8
            elif wire == 5:
                out.append((field, wire, header, pos, pos + 4))
                pos += 4
            elif wire == 2:
                length, payload = self.source.varint(pos, end)
                out.append((field, wire, header, payload, payload + length))
                pos = payload + length
            else:
                raise StripError(f"malformed protobuf: wire type {wire} of field {field}", header)
            if pos > end:
                where = "the file ends" if end == self.source.size else "its enclosing message ends"
                raise StripError(f"truncated: field {field} runs past where {where}", header)
        return out

    def _copy(self, start: int, end: int) -> bytes:
        if end - start > MAX_FIELD_BYTES:
            raise StripError(f"a field of {end - start:,} bytes is larger than {MAX_FIELD_BYTES:,}", start)
        return self.source.read(start, end - start)

    def walk(self, start: int, end: int, kind: int, depth: int = 0) -> bytes:
        if depth > MAX_DEPTH:
            raise StripError(f"nested too deep: more than {MAX_DEPTH} messages within each other", start)
        if kind != _TENSOR and end - start <= _IN_MEMORY and self.source.buf is None:
            # Small sub-message: one read, then walk it in memory.
            inner = _Walker(_Source(None, self.source.read(start, end - start), end - start), self.max_output)
            inner.counts = self.counts
            return inner.walk(0, end - start, kind, depth)
        fields = self._fields(start, end)
        strip_data = kind == _TENSOR and self._strip_tensor(fields)
        children = _CHILDREN[kind]
        dropped = _DROPPED.get(kind, ())
        out = bytearray()
        for field, wire, header, payload, payload_end in fields:
            if field in dropped:
                continue
            if kind == _TENSOR and strip_data:
                if field in _TENSOR_DATA:
                    self.counts.removed += payload_end - payload
                    continue
                if field in (_TENSOR_EXTERNAL, _TENSOR_LOCATION):
                    continue  # replaced by the stripped marker below
            if wire == 2 and field in children:
                body = self.walk(payload, payload_end, children[field], depth + 1)
                out += _encode_varint(field << 3 | 2) + _encode_varint(len(body)) + body
            else:
                out += self._copy(header, payload_end)
            self._grow(len(out))
        if strip_data:
            self.counts.stripped += 1
            entry = _field_bytes(1, b"location") + _field_bytes(2, STRIPPED_LOCATION.encode())
            out += _field_bytes(_TENSOR_EXTERNAL, entry)
            out += _encode_varint(_TENSOR_LOCATION << 3 | 0) + _encode_varint(1)
        return bytes(out)

    def _grow(self, size: int) -> None:
        if self.max_output is not None and size > self.max_output:
            raise GraphTooLarge(self.max_output)

    def _strip_tensor(self, fields: list[tuple[int, int, int, int, int]]) -> bool:
        elements = 1
        external = False
        has_data = False
        for field, wire, _, payload, payload_end in fields:
            if field == _TENSOR_DIMS:
                if wire == 2:  # packed
                    pos = payload
                    while pos < payload_end:
                        dim, pos = self.source.varint(pos, payload_end)
                        elements *= dim
                else:
                    dim, _ = self.source.varint(payload, payload_end)
                    elements *= dim
            elif field == _TENSOR_LOCATION:
                location, _ = self.source.varint(payload, payload_end)
                external = location == 1
            elif field in _TENSOR_DATA:
                has_data = True
        if external and not has_data:
            self.counts.external += 1
            return False
        return elements > KEEP_ELEMENTS


def _field_bytes(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def _strip(source: _Source, max_graph_bytes: int | None) -> Stripped:
    walker = _Walker(source, max_graph_bytes)
    if source.size == 0:
        raise StripError("empty file: not an ONNX model")
    tag, _ = source.varint(0, source.size)
    if _MODEL_FIELDS.get(tag >> 3) != tag & 7:
        raise StripError("not an ONNX model: the file does not start as an ONNX protobuf does")
    try:
        fields = walker._fields(0, source.size)
    except StripError as exc:
        if str(exc).startswith("truncated"):
            raise
        raise StripError(f"not an ONNX model: {exc}") from exc
    if not any(f == _MODEL_GRAPH and w == 2 for f, w, *_ in fields):
        raise StripError("not an ONNX model: the file has no graph")
    data = walker.walk(0, source.size, _MODEL)
    return Stripped(
        data=data,
        original_bytes=source.size,
        tensors_stripped=walker.counts.stripped,
        weight_bytes_removed=walker.counts.removed,
        external_tensors=walker.counts.external,
    )


def strip_file(path: str | Path, max_graph_bytes: int | None = None) -> Stripped:
    """Strip the model at ``path``, reading only what it keeps (weights are skipped with seeks)."""
    p = Path(path)
    with p.open("rb", buffering=64 * 1024) as f:
        return _strip(_Source(f, None, p.stat().st_size), max_graph_bytes)


def strip_stream(f: BinaryIO, size: int, max_graph_bytes: int | None = None) -> Stripped:
    """Strip a model from a seekable binary file object of ``size`` bytes."""
    return _strip(_Source(f, None, size), max_graph_bytes)


def strip_bytes(data: bytes, max_graph_bytes: int | None = None) -> Stripped:
    """Strip a model held in memory (small models, tests)."""
    return _strip(_Source(None, memoryview(data), len(data)), max_graph_bytes)


def strip_any(data: bytes | str | Path | BinaryIO, max_graph_bytes: int | None = None) -> Stripped:
    """Strip a model given as bytes, a path, or a seekable binary file (read from its start)."""
    if isinstance(data, bytes | bytearray):
        return strip_bytes(bytes(data), max_graph_bytes)
    if isinstance(data, str | Path):
        return strip_file(data, max_graph_bytes)
    size = data.seek(0, io.SEEK_END)
    return strip_stream(data, size, max_graph_bytes)
