"""`ipucloud endpoints create|list|show|delete` through Typer's runner against a cloud in real processes,
and the SDK's endpoint calls, both faces. The endpoints start at zero replicas: what these test is
the control plane's face, not serving (the e2e tests of the data plane do that)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ipucloud.sdk import AsyncClient, Client, ConflictError, InvalidRequestError, NotFoundError
from tests.cli.test_cli_client import Cli
from tests.support.cloud import RunningCloud

pytestmark = pytest.mark.e2e


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


class TestOneCloud:
    """Both tests on one running cloud (`shared_cloud`), each as a tenant of its own."""

    def test_create_list_show_and_delete_an_endpoint(self, shared_cloud: RunningCloud, cli: Cli) -> None:
        cloud = shared_cloud
        _, key = cloud.create_tenant("endpoint-cli")
        assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
        made = cli.json(
            "endpoints", "create", "bert", "--model", "bert-base", "--seq-len", "128", "--machine", "m2000",
            "--max-batch-size", "8", "--replicas", "0:2",
        )  # fmt: skip
        assert made["state"] == "scaled-to-zero" and made["replicas"]["max"] == 2
        assert made["url"] == f"{cloud.url}/api/v1/endpoints/{made['id']}"
        listed = cli("endpoints", "list")
        assert listed.exit_code == 0 and made["id"] in listed.stdout and "scaled-to-zero" in listed.stdout
        shown = cli("endpoints", "show", made["id"])
        assert shown.exit_code == 0 and "plan m2000" in shown.stdout and "b8 " in shown.stdout
        # The same name again: a conflict; a bad replica range: usage; an unknown id: not found.
        again = cli(
            "endpoints", "create", "bert", "--model", "bert-base", "--seq-len", "128", "--replicas", "0:1"
        )
        assert again.exit_code == 5
        assert cli("endpoints", "create", "x", "--model", "resnet50", "--replicas", "two").exit_code == 2
        assert cli("endpoints", "show", "ep_" + "0" * 26).exit_code == 4
        gone = cli.json("endpoints", "delete", made["id"])
        assert gone["state"] == "stopped"
        assert cli("endpoints", "delete", made["id"]).exit_code == 5

        # The SDK, both faces.
        with Client(cloud.url, key) as c:
            e = c.create_endpoint(name="r50", model="resnet50", replicas={"min": 0, "max": 1})
            assert c.get_endpoint(e.id).name == "r50"
            assert c.change_endpoint(e.id, max_queue=9, replicas={"min": 0, "max": 2}).max_queue == 9
            assert [x.id for x in c.iter_endpoints(state="scaled-to-zero", page_size=1)] == [e.id]
            m = c.endpoint_metrics(e.id, minutes=5)
            # The rollup may already have written an idle minute (a minute boundary passed): nothing was
            # served.
            assert m.state == "scaled-to-zero" and all(h.requests == 0 and h.replicas == 0 for h in m.history)
            with pytest.raises(InvalidRequestError):
                c.create_endpoint(name="bad", model="resnet50", ipus_per_replica=3)
            assert c.delete_endpoint(e.id).state == "stopped"
            with pytest.raises(ConflictError):
                c.delete_endpoint(e.id)
            with pytest.raises(NotFoundError):
                c.get_endpoint("ep_" + "0" * 26)

        async def face() -> None:
            async with AsyncClient(cloud.url, key) as a:
                e = await a.create_endpoint(name="async", model="resnet50", replicas={"min": 0, "max": 1})
                assert (await a.get_endpoint(e.id)).state == "scaled-to-zero"
                assert (await a.delete_endpoint(e.id)).state == "stopped"

        asyncio.run(face())

    def test_invoke_from_the_cli_and_the_sdk(
        self, shared_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        cloud = shared_cloud
        import numpy as np

        _, key = cloud.create_tenant("endpoint-invoke")
        assert cli("login", "--url", cloud.url, "--key", key).exit_code == 0
        made = cli.json(
            "endpoints", "create", "chains", "--model", "mcmc", "--machine", "m2000", "--replicas", "1",
            "--max-batch-size", "4",
        )  # fmt: skip
        position = np.linspace(-1, 1, 2 * 128, dtype=np.float32).reshape(2, 128)
        np.save(tmp_path / "position.npy", position)
        # The first call may wait for the replica's cold start.
        out = cli.json("endpoints", "invoke", made["id"], "--input", f"position={tmp_path / 'position.npy'}")
        assert out["model_name"] == "chains" and out["batch_size"] == 2
        assert np.asarray(out["outputs"]["draw"]).shape == (2, 128)
        assert len(out["outputs"]["accepted"]) == 2
        assert set(out["timing_ms"]) == {"queue", "batch", "host", "ipu"}
        shown = cli("endpoints", "invoke", made["id"], "-i", "position=" + str(position[:1].tolist()))
        assert shown.exit_code == 0 and "draw" in shown.stdout and "batch of 1" in shown.stdout
        assert cli("endpoints", "invoke", made["id"], "-i", "position=[[1, 2]]").exit_code != 0  # wrong shape

        with Client(cloud.url, key) as c:
            answer = c.infer(made["id"], "chains", {"position": position})
            assert answer.outputs["draw"].shape == (2, 128) and answer.outputs["draw"].dtype == np.float32
            assert answer.outputs["accepted"].dtype == np.bool_
            assert answer.batch_size == 2 and answer.latency_ms > 0
            # The same request in JSON through the CLI gave the same numbers: outputs follow the inputs.
            np.testing.assert_array_equal(
                answer.outputs["draw"], np.asarray(out["outputs"]["draw"], np.float32)
            )
            with pytest.raises(InvalidRequestError):
                c.infer(made["id"], "chains", {"position": position[:, :10]})
            c.delete_endpoint(made["id"])
