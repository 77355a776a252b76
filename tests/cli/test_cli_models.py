"""`ipucloud models push|list|show|rm`, jobs on an own model and `ipucloud estimate --model-file`, through
Typer's runner against a cloud in real processes; every bad input is refused and stores nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_cli_client import Cli
from tests.support import onnx_files
from tests.support.cloud import RunningCloud, start_shared
from vipu.emulator.onnxgraph.renderings import render_bytes

pytestmark = pytest.mark.e2e


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "home" / "ipucloud" / "config.json")


@pytest.fixture(scope="class")
def small_cloud(
    database_url: str, redis_url: str, secret_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCloud]:
    """A cloud whose API keeps graphs of at most 64 KiB (weights stripped), started once for
    TestOneCloud's tests (docs/architecture.md, "Tests")."""
    extra = {"IPUCLOUD_MODEL_GRAPH_MAX_BYTES": str(64 * 1024)}
    with start_shared(
        database_url, redis_url, secret_key, tmp_path_factory, extra_env=extra, pods=1
    ) as running:
        yield running


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


class TestOneCloud:
    """Tenants of their own on one running cloud (`small_cloud`). The refusals run last: they lower the
    standard plan's model limit."""

    def test_push_list_show_run_and_remove_a_model(
        self, small_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        _, key = small_cloud.create_tenant("byom-cli")
        assert cli("login", "--url", small_cloud.url, "--key", key).exit_code == 0
        # A BERT-Base export with its 440 MB of weights would travel as its graph only; here, the rendering
        # with weights of an MLP: the upload is the stripped graph.
        weighted = write(tmp_path, "mlp.onnx", onnx_files.mlp(hidden=512, layers=4))
        pushed = cli.json("models", "push", weighted)
        assert pushed["name"] == "mlp" and pushed["uploaded_bytes"] < 8192 < Path(weighted).stat().st_size
        assert pushed["weights_stripped_bytes"] == 0  # stripped here, before it left this machine

        bert = write(tmp_path, "bert.onnx", render_bytes("bert-base", "infer", 128))
        shown = cli("models", "push", bert, "--dim", "sequence=128")
        assert shown.exit_code == 0, shown.stderr
        assert "sequence=128" in shown.stdout and "108,893,186" in shown.stdout
        names = [m["name"] for m in cli.json("models", "list")["items"]]
        assert names == ["bert", "mlp"]
        assert cli.json("models", "show", "bert")["dims"] == {"sequence": 128}

        dry = cli.json(
            "jobs",
            "submit",
            "--model",
            "bert",
            "--task",
            "infer",
            "--batch-size",
            "256",
            "--ipus",
            "4",
            "--steps",
            "10",
            "--dim",
            "sequence=384",
            "--dry-run",
        )
        assert dry["fits"] and dry["throughput"] > 0
        local = cli.json(
            "estimate",
            "--model-file",
            bert,
            "--task",
            "infer",
            "--batch-size",
            "256",
            "--ipus",
            "4",
            "--seq-len",
            "384",
            "--machine",
            "m2000",
        )
        assert local["throughput"] == pytest.approx(dry["throughput"], rel=1e-9)

        run = cli(
            "jobs",
            "submit",
            "--model",
            "mlp",
            "--batch-size",
            "256",
            "--steps",
            "50",
            "--ipus",
            "1",
            "--optimizer",
            "sgd",
            "--follow",
        )
        assert run.exit_code == 0, (run.stdout, run.stderr)
        assert "succeeded" in run.stderr

        removed = cli.json("models", "rm", "mlp")
        assert removed["name"] == "mlp"
        assert [m["name"] for m in cli.json("models", "list")["items"]] == ["bert"]
        missing = cli("models", "show", "mlp")
        assert missing.exit_code == 4

    def test_bad_models_are_refused_by_the_cli_and_store_nothing(
        self, small_cloud: RunningCloud, cli: Cli, tmp_path: Path
    ) -> None:
        _, key = small_cloud.create_tenant("careful-cli")
        assert cli("login", "--url", small_cloud.url, "--key", key).exit_code == 0
        bert = render_bytes("bert-base", "infer", 128)
        cases: list[tuple[str, bytes, list[str], int, list[str]]] = [
            ("text.onnx", b"not a model at all\n", [], 2, ["not an ONNX model"]),
            ("truncated.onnx", bert[: len(bert) // 3], [], 2, ["truncated"]),
            ("empty.onnx", b"", [], 2, ["empty file"]),
            ("cycle.onnx", onnx_files.cycle_model(), [], 2, ["cycle", "first"]),
            ("dangling.onnx", onnx_files.dangling_model(), [], 2, ["ghost"]),
            ("custom.onnx", onnx_files.custom_op_model(), [], 2, ["acme::FastSwish", "elementwise"]),
            ("loop.onnx", onnx_files.loop_model(), [], 2, ["Loop"]),
            ("mismatch.onnx", onnx_files.shape_mismatch_model(), [], 2, ["shape inference"]),
            ("big.onnx", render_bytes("bert-large", "infer", 128), ["--dim", "sequence=128"], 2, ["65,536"]),
            ("resnet50.onnx", onnx_files.mlp(), [], 2, ["catalogue workload"]),
        ]
        for name, data, extra, code, words in cases:
            result = cli("models", "push", write(tmp_path, name, data), *extra)
            assert result.exit_code == code, (name, result.stdout, result.stderr)
            for word in words:
                assert word in result.stderr, (name, word, result.stderr)
            problem = cli("models", "push", write(tmp_path, name, data), *extra, "--json")
            assert problem.exit_code == code and json.loads(problem.stderr)["detail"], (name, problem.stderr)
        assert cli.json("models", "list")["items"] == []
        # Declared element-wise, the same file is taken; a dynamic sequence is taken with or without a size
        # (#32 item 4: without one, each job gives it, and the model is described at 128).
        ok = cli(
            "models",
            "push",
            write(tmp_path, "custom.onnx", onnx_files.custom_op_model()),
            "--elementwise",
            "acme::FastSwish",
        )
        assert ok.exit_code == 0, ok.stderr
        ok = cli("models", "push", write(tmp_path, "dynamic.onnx", onnx_files.sequence_model()))
        assert ok.exit_code == 0, ok.stderr
        assert "sequence: the job's --seq-len/--dim (described at 128)" in " ".join(ok.stdout.split()), (
            ok.stdout
        )
        assert (
            cli("models", "push", write(tmp_path, "x.onnx", onnx_files.mlp()), "--dim", "nonsense").exit_code
            == 2
        )
        with small_cloud.admin() as c:
            assert c.patch("/api/v1/admin/plans/standard", json={"max_models": 2}).status_code == 200
        over = cli("models", "push", write(tmp_path, "third.onnx", onnx_files.mlp()))
        assert over.exit_code == 5 and "max_models" not in over.stdout and "at most 2 models" in over.stderr
        assert sorted(m["name"] for m in cli.json("models", "list")["items"]) == ["custom", "dynamic"]
        local = cli("estimate", "--model-file", write(tmp_path, "cycle.onnx", onnx_files.cycle_model()))
        assert local.exit_code == 2 and "cycle" in local.stderr
        local = cli("estimate", "--model-file", write(tmp_path, "dyn.onnx", onnx_files.sequence_model()))
        assert local.exit_code == 2 and "--seq-len" in local.stderr


def test_dim_sizes_are_ascii_digits() -> None:
    """`--dim seq=²` was a traceback from `int`; Arabic-Indic digits were taken as a size."""
    import typer

    from ipucloud.cli.client_models import parse_dims

    assert parse_dims(["seq=128"]) == {"seq": 128}
    for bad in ("seq=\u00b2", "seq=\u0661\u0662", "seq=0", "seq=" + "9" * 5000):
        with pytest.raises(typer.Exit):
            parse_dims([bad])
