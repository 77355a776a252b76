"""The SDK's own-model calls (sync and async) against a cloud in real processes: weights are stripped
before they leave the client, the model is described, run by name, listed, refused when bad, removed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import ipucloud
from ipucloud.sdk import ConflictError, InvalidRequestError, NotFoundError
from tests.support import onnx_files
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


def test_sync_and_async_clients_push_run_and_remove_models(cloud: RunningCloud, tmp_path: Path) -> None:
    _, key = cloud.create_tenant("sdk-models")
    weighted = tmp_path / "net.onnx"
    weighted.write_bytes(onnx_files.mlp(hidden=512, layers=4))
    with ipucloud.Client(cloud.url, key) as c:
        m = c.push_model(weighted)
        assert isinstance(m, ipucloud.OnnxModel) and m.name == "net"
        assert m.uploaded_bytes and m.uploaded_bytes < 8192 < weighted.stat().st_size
        assert m.parameters == 64 * 512 + 512 + 3 * (512 * 512 + 512)
        est = c.estimate(model="net", task="infer", batch_size=128, steps=10, ipus=1)
        assert est.fits and est.throughput
        job = c.submit_job(
            name="sdk-own", model=m.id, batch_size=128, steps=20, ipus=1, optimizer="sgd-momentum"
        )
        assert job.workload["model"] == m.id and job.workload["optimizer"] == "sgd-momentum"
        assert c.wait_job(job.id, timeout=120).state == "succeeded"
        with pytest.raises(ConflictError):
            c.push_model(weighted)  # the same name again
        bad = tmp_path / "cycle.onnx"
        bad.write_bytes(onnx_files.cycle_model())
        with pytest.raises(InvalidRequestError) as err:
            c.push_model(bad)
        assert err.value.extra["reason"] == "cycle"
        custom = tmp_path / "custom.onnx"
        custom.write_bytes(onnx_files.custom_op_model())
        declared = c.push_model(custom, name="swish", elementwise=["acme::FastSwish"])
        assert declared.declared_elementwise == ["acme::FastSwish"]

    async def run() -> None:
        async with ipucloud.AsyncClient(cloud.url, key) as ac:
            seq = tmp_path / "seq.onnx"
            seq.write_bytes(onnx_files.sequence_model())
            pushed = await ac.push_model(seq, dims={"sequence": 64})
            assert pushed.dims == {"sequence": 64}
            names = [x.name async for x in ac.iter_models(page_size=1)]
            assert names == ["seq", "swish", "net"]
            assert (await ac.get_model("seq")).id == pushed.id
            assert (await ac.delete_model(pushed.id)).name == "seq"
            with pytest.raises(NotFoundError):
                await ac.get_model(pushed.id)

    asyncio.run(run())
