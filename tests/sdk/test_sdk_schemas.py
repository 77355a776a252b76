"""The SDK's models of the API's answers are generated from the committed spec, and are current."""

from __future__ import annotations

import json
from typing import Any

from scripts.gen_sdk_models import OUT_FILE, SPEC_FILE, render


def test_generated_sdk_models_match_the_committed_spec() -> None:
    current = render(json.loads(SPEC_FILE.read_text()))
    committed = OUT_FILE.read_text() if OUT_FILE.exists() else ""
    assert committed == current, (
        "ipucloud/sdk/_schemas.py is stale: regenerate it with `.venv/bin/python -m scripts.gen_sdk_models` "
        "(after `.venv/bin/python -m scripts.export_openapi`) and commit it with your schema change"
    )


def test_a_field_added_to_an_answer_reaches_the_sdk_typed() -> None:
    spec = json.loads(SPEC_FILE.read_text())
    spec["components"]["schemas"]["JobOut"]["properties"]["energy_kwh"] = {
        "anyOf": [{"type": "number"}, {"type": "null"}],
        "title": "Energy Kwh",
    }
    spec["components"]["schemas"]["JobOut"]["required"].append("energy_kwh")
    namespace: dict[str, object] = {}
    exec(compile(render(spec), "_schemas.py", "exec"), namespace)
    job_cls: Any = namespace["Job"]
    job_cls.model_rebuild(_types_namespace=namespace)
    job = job_cls.model_validate(
        {"id": "job_1", "name": "x", "state": "queued", "ipus": 1, "energy_kwh": "1.5"}
    )
    assert job.energy_kwh == 1.5 and job.done is False
    # An older server that does not send it is still read.
    assert job_cls.model_validate({"id": "j", "name": "x", "state": "queued", "ipus": 1}).energy_kwh is None
