"""The dashboard's model pages over HTTP: upload a graph with a plain form, see it described, pick it on
the submit form beside the catalogue, run it, and remove it; bad files and forged forms store nothing."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.browser.test_dashboard_http import csrf_of, make_tenant, sign_in
from tests.support import onnx_files
from tests.support.services import Seeded


def upload(client: TestClient, csrf: str, data: bytes, filename: str, **fields: str) -> Any:
    return client.post(
        "/models/upload",
        data={"csrf": csrf, **fields},
        files={"file": (filename, data, "application/octet-stream")},
        follow_redirects=False,
    )


def test_upload_describe_choose_run_and_remove_a_model(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key = make_tenant(db, "acme", plan="standard")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/models")
    r = upload(
        client, csrf, onnx_files.rendering("bert-base", "infer", 128), "bert.onnx", dims='{"sequence": 128}'
    )
    assert r.status_code == 303, r.text
    page = client.get(r.headers["location"])
    assert page.status_code == 200
    assert "108,893,186" in page.text and "sequence=128" in page.text and "input_ids" in page.text
    listing = client.get("/models")
    assert "bert" in listing.text and "Model bert uploaded." in page.text + listing.text

    form = client.get("/jobs/new?model=bert")
    assert 'label="Your models"' in form.text and 'label="Catalogue"' in form.text
    assert '<option value="bert"' in form.text and 'value="bert" data-batch="256"' in form.text
    assert "selected>bert</option>" in form.text
    csrf = csrf_of(client, "/jobs/new")
    values = {
        "model": "bert",
        "task": "infer",
        "batch_size": "64",
        "steps": "10",
        "ipus": "4",
        "precision": "fp16",
    }
    preview = client.post("/jobs/new", data={**values, "csrf": csrf, "action": "preview"})
    assert preview.status_code == 200 and "samples/s" in preview.text
    submitted = client.post(
        "/jobs/new", data={**values, "csrf": csrf, "action": "submit"}, follow_redirects=False
    )
    assert submitted.status_code == 303, submitted.text
    job_page = client.get(submitted.headers["location"])
    assert job_page.status_code == 200

    model_id = r.headers["location"].rsplit("/", 1)[1]
    csrf = csrf_of(client, f"/models/{model_id}")
    refused = client.post(f"/models/{model_id}/delete", data={"csrf": csrf}, follow_redirects=False)
    assert refused.status_code == 409 and "used by queued or running jobs" in refused.text
    job_id = submitted.headers["location"].rsplit("/", 1)[1]
    from scheduler.services.batch import jobs as job_service
    from scheduler.services.tenancy.scope import ALL_TENANTS

    with db.write() as s:
        job_service.request_cancel(session=s, job_id=job_id, scope=ALL_TENANTS)
    removed = client.post(f"/models/{model_id}/delete", data={"csrf": csrf}, follow_redirects=False)
    assert removed.status_code == 303 and removed.headers["location"] == "/models"
    assert "No models yet." in client.get("/models").text


def test_bad_uploads_and_forged_forms_store_nothing(client: TestClient, seeded: Seeded, db: Any) -> None:
    _, key = make_tenant(db, "acme", plan="standard")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/models")
    for data, filename, fields, words in (
        (b"hello", "text.onnx", {}, "not an ONNX model"),
        (onnx_files.custom_op_model(), "custom.onnx", {}, "acme::FastSwish"),
        (onnx_files.cycle_model(), "cycle.onnx", {}, "cycle"),
        (onnx_files.mlp(), "gru.onnx", {}, "catalogue workload"),
    ):
        r = upload(client, csrf, data, filename, **fields)
        assert r.status_code in (409, 413, 422), (filename, r.status_code)
        assert words in r.text, (filename, r.text[-2000:])
    forged = upload(client, "not-the-token", onnx_files.mlp(), "mlp.onnx")
    assert forged.status_code == 403
    assert "No models yet." in client.get("/models").text


# Issue 32 item 6: the upload read its whole body (up to 2 GiB) to disk before its Origin and CSRF
# checks, and a client that went away mid-upload was logged as an unhandled error. These drive the
# ASGI app a chunk at a time, as a server does, and count the chunks it asked for.

BOUNDARY = "hardening32"
CHUNK = 256 * 1024


def _multipart_chunks(csrf: str, file_chunks: int) -> list[bytes]:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n{csrf}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return [head] + [b"\x08" * CHUNK] * file_chunks + [f"\r\n--{BOUNDARY}--\r\n".encode()]


def _drive(
    client: TestClient, chunks: list[bytes], *, origin: str | None = None, disconnect: bool = False
) -> tuple[int | None, int]:
    """POST /models/upload straight into the app; (status, chunks the app read)."""
    import anyio

    consumed = 0
    status: int | None = None

    async def receive() -> dict[str, Any]:
        nonlocal consumed
        if consumed < len(chunks):
            consumed += 1
            return {"type": "http.request", "body": chunks[consumed - 1], "more_body": True}
        if disconnect:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    headers = {
        "host": "testserver",
        "content-type": f"multipart/form-data; boundary={BOUNDARY}",
        "cookie": "; ".join(f"{k}={v}" for k, v in client.cookies.items()),
    }
    if origin is not None:
        headers["origin"] = origin
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/models/upload",
        "raw_path": b"/models/upload",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }
    anyio.run(client.app, scope, receive, send)  # type: ignore[arg-type]
    return status, consumed


def test_a_cross_site_or_forged_upload_is_refused_before_its_file_is_read(
    client: TestClient, seeded: Seeded, db: Any, caplog: Any
) -> None:
    _, key = make_tenant(db, "acme", plan="standard")
    assert sign_in(client, key).status_code == 303
    csrf = csrf_of(client, "/models")
    chunks = _multipart_chunks(csrf, 40)  # 10 MiB of file

    status, read = _drive(client, chunks, origin="https://evil.example")
    assert status == 403 and read == 0, (status, read)
    status, read = _drive(client, _multipart_chunks("forged", 40))
    assert status == 403 and read <= 2, (status, read)  # the csrf field, not the file

    caplog.clear()
    status, read = _drive(client, chunks[:10], disconnect=True)
    assert read == 10
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]
