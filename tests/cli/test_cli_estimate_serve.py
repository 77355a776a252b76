"""`ipucloud estimate --serve`: a serving replica's latency and throughput per batch size, planned on
this machine (no cloud), as a table and in `--json`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ipucloud.cli import app

BERT = ["estimate", "--model", "bert-base", "--task", "infer", "--seq-len", "128", "--machine", "m2000"]


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_serve_rows_print_as_a_table_and_in_json() -> None:
    code, out, err = run(*BERT, "--ipus", "1", "--serve", "1,8,64,4096")
    assert code == 0, err
    assert "Serving on a replica of 1 x m2000 IPU(s)" in out and "host call 90 us" in out
    lines = {
        line.split()[1]: line
        for line in out.splitlines()
        if line.startswith("│") and line.split()[1].isdigit()
    }
    assert set(lines) == {"1", "8", "64", "4096"}
    assert "does not fit" in lines["4096"] and "does not fit" not in lines["64"]
    assert "batch 4096: a batch of 4096 does not fit" in err

    code, out, _ = run(*BERT, "--ipus", "1", "--serve", "1,8,64", "--json")
    assert code == 0
    answer = json.loads(out)
    rows = answer["serve"]
    assert [r["batch_size"] for r in rows] == [1, 8, 64] and all(r["fits"] for r in rows)
    assert rows[0]["latency_ms"] < rows[1]["latency_ms"] < rows[2]["latency_ms"]
    assert rows[0]["throughput"] < rows[1]["throughput"] < rows[2]["throughput"]
    assert answer["serve_plan"]["signature"]["outputs"][0] == {
        "name": "start_logits",
        "datatype": "FP32",
        "shape": [-1, 128],
    }
    # The table prints the same figures the JSON has.
    assert f"{rows[2]['latency_ms']:,.3f}" in lines["64"]


def test_a_pcie_machine_has_its_own_host_call_and_bad_flags_are_refused() -> None:
    code, out, err = run(*BERT[:-1], "c2", "--ipus", "auto", "--serve", "1,2", "--json")
    assert code == 0, err
    assert json.loads(out)["serve"][0]["host_call_ms"] == 0.054
    for bad in ("", "1,,x", "-1", "1.5"):
        code, _, err = run(*BERT, "--serve", bad)
        assert code == 2 and "--serve takes batch sizes" in err, (bad, err)
    code, _, err = run(*BERT, "--serve", "0")
    assert code == 2 and "serve.batch_sizes" in err  # an invalid request: 2, as the server's 422
    code, _, err = run("estimate", "--model", "resnet50", "--task", "train", "--serve", "8")
    assert code == 2 and "serve applies to inference" in err
