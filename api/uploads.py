"""Receive a multipart model upload onto disk as it arrives: the file part never sits in memory.

A model with its weights can be gigabytes; the CLI and SDK strip the weights first, but the API also
takes the full file, up to ``IPUCLOUD_MODEL_UPLOAD_MAX_BYTES``. The body is parsed incrementally
(``python-multipart``), the ``file`` part written to a temporary file in ``IPUCLOUD_UPLOAD_DIR``, and
the small text fields kept. The caller strips the file (``vipu.emulator.onnxgraph.strip``) and removes it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from anyio import to_thread
from fastapi import Request
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from scheduler.errors import DomainError, InvalidRequest, PayloadTooLarge, UnsupportedMediaType

MAX_FIELD_BYTES = 16 * 1024
FLUSH_BYTES = 1 << 20


@dataclass
class Upload:
    """The received ``file`` part on disk, its client-side name, and the text fields."""

    path: Path
    size: int
    filename: str | None
    fields: dict[str, str] = field(default_factory=dict)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class _State:
    def __init__(
        self,
        fields: frozenset[str],
        max_bytes: int,
        spool: IO[bytes],
        before_file: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self.allowed = fields
        self.before_file = before_file
        self.max_bytes = max_bytes
        self.spool = spool
        self.header_field = bytearray()
        self.header_value = bytearray()
        self.name: str | None = None
        self.filename: str | None = None
        self.value = bytearray()
        self.fields: dict[str, str] = {}
        self.file_seen = False
        self.file_filename: str | None = None
        self.size = 0
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.error: DomainError | None = None

    def fail(self, error: DomainError) -> None:
        if self.error is None:
            self.error = error

    # python-multipart callbacks -----------------------------------------------------------------------

    def on_part_begin(self) -> None:
        self.name = self.filename = None
        self.value = bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        if bytes(self.header_field).lower() == b"content-disposition":
            _, params = parse_options_header(bytes(self.header_value))
            name = params.get(b"name")
            filename = params.get(b"filename")
            self.name = name.decode("utf-8", "replace") if name is not None else None
            self.filename = filename.decode("utf-8", "replace") if filename is not None else None
        self.header_field = bytearray()
        self.header_value = bytearray()

    def on_headers_finished(self) -> None:
        if self.name not in self.allowed:
            self.fail(
                InvalidRequest(
                    f"Unknown form field {self.name!r}; a model upload takes "
                    f"{', '.join(sorted(self.allowed))}.",
                    field=self.name or "",
                )
            )
        elif self.name == "file":
            if self.file_seen:
                self.fail(InvalidRequest("Send one `file` per upload.", field="file"))
            elif self.before_file is not None:
                try:  # the fields sent before the file (a form's CSRF token), judged before it is read
                    self.before_file(self.fields)
                except DomainError as exc:
                    self.fail(exc)
            self.file_seen = True
            self.file_filename = self.filename

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error is not None:
            return
        chunk = data[start:end]
        if self.name == "file":
            self.size += len(chunk)
            if self.size > self.max_bytes:
                self.fail(
                    PayloadTooLarge(
                        f"The model file is larger than {self.max_bytes:,} bytes. Strip its weights first: "
                        "`ipucloud models push` and the SDK send only the graph.",
                        limit=self.max_bytes,
                    )
                )
                return
            self.pending.append(chunk)
            self.pending_bytes += len(chunk)
        else:
            self.value += chunk
            if len(self.value) > MAX_FIELD_BYTES:
                self.fail(
                    InvalidRequest(
                        f"Form field {self.name!r} is longer than {MAX_FIELD_BYTES:,} bytes.",
                        field=self.name or "",
                    )
                )

    def on_part_end(self) -> None:
        if self.name is not None and self.name != "file" and self.error is None:
            try:
                self.fields[self.name] = self.value.decode("utf-8")
            except UnicodeDecodeError:
                self.fail(InvalidRequest(f"Form field {self.name!r} is not UTF-8 text.", field=self.name))


async def receive_upload(
    request: Request,
    *,
    fields: frozenset[str],
    max_bytes: int,
    spool_dir: Path | None,
    before_file: Callable[[dict[str, str]], None] | None = None,
) -> Upload:
    """Parse the multipart body, spooling its ``file`` part to disk. Raises a 4xx ``DomainError``.

    ``before_file`` is called with the text fields sent before the file part, as that part begins:
    an error it raises ends the upload there, without reading the file. A client that goes away
    mid-upload is an ``InvalidRequest`` (nobody hears it), not an unhandled error."""
    content_type = request.headers.get("content-type", "")
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise UnsupportedMediaType(
            "Send the model as multipart/form-data with the ONNX file in the field `file` "
            "(curl -F file=@model.onnx ...)."
        )
    if spool_dir is not None:
        spool_dir.mkdir(parents=True, exist_ok=True)
    spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed below, removed by the caller)
        prefix="ipucloud-upload-", suffix=".onnx", dir=spool_dir, delete=False
    )
    state = _State(fields, max_bytes, spool, before_file)
    callbacks = {
        "on_part_begin": state.on_part_begin,
        "on_part_data": state.on_part_data,
        "on_part_end": state.on_part_end,
        "on_header_field": state.on_header_field,
        "on_header_value": state.on_header_value,
        "on_header_end": state.on_header_end,
        "on_headers_finished": state.on_headers_finished,
    }
    parser = MultipartParser(boundary, callbacks)  # type: ignore[arg-type]
    upload = Upload(Path(spool.name), 0, None)
    try:
        try:
            async for chunk in request.stream():
                parser.write(chunk)
                if state.error is not None:
                    raise state.error
                if state.pending_bytes >= FLUSH_BYTES:
                    await _flush(state)
            parser.finalize()
        except MultipartParseError as exc:
            raise InvalidRequest(f"The multipart body is malformed: {exc}.", field="file")
        except ClientDisconnect:
            raise InvalidRequest("The client went away before the upload ended.", field="file")
        if state.error is not None:
            raise state.error
        await _flush(state)
        spool.close()
        if not state.file_seen:
            raise InvalidRequest("The ONNX file is missing: send it in the form field `file`.", field="file")
        upload.size = state.size
        upload.filename = state.file_filename
        upload.fields = state.fields
        return upload
    except BaseException:
        spool.close()
        upload.remove()
        raise


async def _flush(state: _State) -> None:
    if not state.pending:
        return
    data = b"".join(state.pending)
    state.pending.clear()
    state.pending_bytes = 0
    await to_thread.run_sync(state.spool.write, data)
