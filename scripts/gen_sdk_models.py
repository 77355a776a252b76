"""Write the SDK's models of the API's answers from docs/openapi.json (`--check`: exit 1 if stale).

    .venv/bin/python -m scripts.export_openapi   # after changing api/schemas/ or a route
    .venv/bin/python -m scripts.gen_sdk_models   # then this: ipucloud/sdk/_schemas.py follows
    .venv/bin/python -m scripts.gen_sdk_models --check   # what tests/sdk/test_sdk_schemas.py asserts

The SDK is client-side and may not import `api/`, so it cannot share the API's pydantic classes; it
reads the committed spec instead, so a field added to an `api/schemas/` model reaches the SDK by
regenerating, with no hand edit. Every schema a route answers with (and every schema those refer to)
becomes a class named as the SDK has always named it (`JobOut` -> `Job`, `ModelOut` -> `OnnxModel`).

The SDK reads answers leniently, as its hand-written models did: unknown fields are kept
(`extra="allow"`), and only the fields in `REQUIRED` must be present; any other field the spec
requires gets an empty or null default, so a client never fails on an answer from an older server.
"""

from __future__ import annotations

import json
import keyword
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILE = ROOT / "docs" / "openapi.json"
OUT_FILE = ROOT / "ipucloud" / "sdk" / "_schemas.py"

# Spec names that the rule (drop a trailing `Out`) would not give the name the SDK exports.
RENAME = {"ModelOut": "OnnxModel"}

# Schemas that answer routes but that the SDK does not model from the spec: a page is the generic
# `Page[T]` (ipucloud/sdk/_base.py), a problem is raised as an `ApiError`.
SKIP_PREFIXES = ("Page_",)
SKIP = {"Problem"}

# The fields an answer must have for the SDK to read it: the ones that identify it. These are the
# fields the hand-written models required before they were generated; a field added to the API
# later is optional in the SDK unless it is added here.
REQUIRED: dict[str, set[str]] = {
    "Job": {"id", "name", "state", "ipus"},
    "Endpoint": {"id", "name", "url", "model", "state", "replicas"},
    "EndpointReplicas": {"min", "max", "desired", "ready"},
    "HistoryEntry": {"at", "message"},
    "WaitReason": {"reason", "detail"},
    "Checkpoint": {"step", "steps", "samples", "executable", "reason", "at"},
    "LogEntry": {"id", "at", "kind", "message"},
    "Logs": {"job_id", "state", "items"},
    "Estimate": {"fits"},
    "Usage": {"tenant_id", "plan", "quota_ipu_hours", "used_ipu_hours", "remaining_ipu_hours"},
    "TenantUsage": {"tenant_id", "name", "plan", "quota_ipu_hours", "used_ipu_hours"},
    "AdminUsage": {"tenants"},
    "Tenant": {"id", "name", "plan", "status", "quota_ipu_hours", "used_ipu_hours", "remaining_ipu_hours"},
    "TenantCreated": {"api_key"},
    "Plan": {"name"},
    "OnnxModel": {"id", "name"},
    "TrialReceipt": {"id", "name", "status"},
    "ApiKey": {"id"},
    "ApiKeyCreated": {"api_key"},
    "Partition": {"id", "size"},
    "SessionEvent": {"at", "kind", "message"},
    "Session": {"id", "state", "ipus", "machine", "max_duration_s", "idle_timeout_s"},
    "Workload": {"name"},
    "Catalogue": {"items"},
    "Fleet": {"pods"},
    "FleetPod": {"id", "index", "machine_type"},
    "FleetMachine": {"id", "slot", "health"},
    "FleetIpu": {"id"},
    "Racks": {"racks"},
    "Rack": {"id", "index"},
    "RackUnit": {"id", "index", "machine_type", "layout", "ipus"},
    "ServersAdded": {"servers"},
    "RackHealth": {"rack", "health", "machines"},
    "Retired": {"retired"},
    "Machine": {"id", "health"},
    "PartitionReset": {"partition"},
}

# Defaults the hand-written models gave fields the spec requires, kept so that reading a partial
# answer gives what it gave before. Any other optional field defaults to empty (lists, maps), False
# (flags) or None.
DEFAULTS: dict[tuple[str, str], Any] = {
    ("Job", "priority"): 0,
    ("Job", "attempts"): 0,
    ("Usage", "reserved_ipu_hours"): 0.0,
    ("TenantUsage", "reserved_ipu_hours"): 0.0,
    ("Tenant", "reserved_ipu_hours"): 0.0,
    ("Tenant", "fairshare_weight"): 1.0,
    ("Plan", "description"): "",
    ("ApiKey", "name"): "",
    ("Partition", "gcds"): 1,
    ("Session", "gcds"): 1,
    ("Session", "held_s"): 0.0,
    ("Session", "busy_gcds"): 0,
    ("Session", "billed_ipu_hours"): 0.0,
}

# Methods the SDK adds to a generated class (ipucloud/sdk/_base.py), as bases before `Model`.
MIXINS = {"Job": "JobHelpers", "Session": "SessionHelpers"}

HEADER = '''"""The API's answers as the SDK reads them. GENERATED from docs/openapi.json: do not edit.

Regenerate with `.venv/bin/python -m scripts.gen_sdk_models` (see scripts/gen_sdk_models.py for the
rules: names, which fields are required, defaults).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from ipucloud.sdk._base import {imports}
'''


def sdk_name(spec_name: str) -> str:
    if spec_name in RENAME:
        return RENAME[spec_name]
    return spec_name.removesuffix("Out") if spec_name.endswith("Out") else spec_name


def ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def answered(spec: dict[str, Any]) -> list[str]:
    """The schemas routes answer with (2xx JSON), unwrapping pages, and every schema they refer to."""
    schemas = spec["components"]["schemas"]
    roots: list[str] = []
    for item in spec["paths"].values():
        for op in item.values():
            for status, response in op.get("responses", {}).items():
                if not status.startswith("2"):
                    continue
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                roots.extend(refs(schema))
    seen: list[str] = []
    todo = list(roots)
    while todo:
        name = todo.pop(0)
        if name in seen or name in SKIP:
            continue
        seen.append(name)
        todo.extend(refs(schemas[name]))
    return [n for n in seen if not n.startswith(SKIP_PREFIXES)]


def refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        out = [ref_name(schema["$ref"])] if "$ref" in schema else []
        for value in schema.values():
            out.extend(refs(value))
        return out
    if isinstance(schema, list):
        return [r for value in schema for r in refs(value)]
    return []


def annotation(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return sdk_name(ref_name(schema["$ref"]))
    if "anyOf" in schema:
        parts: list[str] = []
        for option in schema["anyOf"]:
            text = annotation(option)
            if text not in parts:
                parts.append(text)
        # `None` last, as people write it.
        parts.sort(key=lambda p: p == "None")
        return " | ".join(parts)
    if "enum" in schema or "const" in schema:
        # Read as its plain type, not a Literal: a server that grows a new state or kind must not
        # make an older client refuse its answers.
        values = schema.get("enum") or [schema.get("const")]
        return {str: "str", int: "int", float: "float", bool: "bool"}.get(type(values[0]), "Any")
    kind = schema.get("type")
    if kind == "null":
        return "None"
    if kind == "string":
        return "datetime" if schema.get("format") == "date-time" else "str"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "float"
    if kind == "boolean":
        return "bool"
    if kind == "array":
        return f"list[{annotation(schema.get('items', {}))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        value = annotation(extra) if isinstance(extra, dict) and extra else "Any"
        return f"dict[str, {value}]"
    return "Any"


def default_for(cls: str, field: str, schema: dict[str, Any], text: str) -> tuple[str, str]:
    """The annotation (widened to allow None where None is the default) and the default's source."""
    if (cls, field) in DEFAULTS:
        return text, repr(DEFAULTS[(cls, field)])
    if "default" in schema:
        value = schema["default"]
        if isinstance(value, list | dict):
            return text, f"Field(default_factory=lambda: {value!r})" if value else _empty(value)
        if value is None and "None" not in text.split(" | "):
            text += " | None"
        return text, repr(value)
    if "None" in text.split(" | "):
        return text, "None"
    if text.startswith("list["):
        return text, "Field(default_factory=list)"
    if text.startswith("dict["):
        return text, "Field(default_factory=dict)"
    if text == "bool":
        return text, "False"
    if "None" not in text.split(" | "):
        text += " | None"
    return text, "None"


def _empty(value: list[Any] | dict[str, Any]) -> str:
    return "Field(default_factory=list)" if isinstance(value, list) else "Field(default_factory=dict)"


def parent_of(name: str, names: list[str], schemas: dict[str, Any]) -> str | None:
    """The answered schema whose fields open this one's, in order: the class it was derived from."""
    props = list(schemas[name].get("properties", {}))
    best: str | None = None
    for other in names:
        theirs = list(schemas[other].get("properties", {}))
        if other == name or not theirs or len(theirs) >= len(props) or props[: len(theirs)] != theirs:
            continue
        if any(schemas[other]["properties"][p] != schemas[name]["properties"][p] for p in theirs):
            continue
        if best is None or len(theirs) > len(schemas[best]["properties"]):
            best = other
    return best


def render_class(name: str, names: list[str], schemas: dict[str, Any]) -> str:
    schema = schemas[name]
    cls = sdk_name(name)
    parent = parent_of(name, names, schemas)
    inherited = set(schemas[parent]["properties"]) if parent else set()
    bases = [MIXINS[cls]] if cls in MIXINS else []
    bases.append(sdk_name(parent) if parent else "Model")
    lines = [f"class {cls}({', '.join(bases)}):"]
    doc = schema.get("description")
    if doc:
        lines.append(f'    """{doc.strip()}"""')
        lines.append("")
    required = REQUIRED.get(cls, set())
    fields: list[str] = []
    for field, prop in schema.get("properties", {}).items():
        if field in inherited:
            continue
        attr = field + "_" if keyword.iskeyword(field) else field
        text = annotation(prop)
        if field in required:
            fields.append(f"    {attr}: {text}")
        else:
            text, default = default_for(cls, field, prop, text)
            fields.append(f"    {attr}: {text} = {default}")
    lines.extend(fields or ["    pass"])
    return "\n".join(lines)


def render(spec: dict[str, Any]) -> str:
    schemas = spec["components"]["schemas"]
    names = answered(spec)
    # Parents before children, otherwise in the order routes first answer with them.
    ordered: list[str] = []

    def place(name: str) -> None:
        if name in ordered:
            return
        parent = parent_of(name, names, schemas)
        if parent:
            place(parent)
        ordered.append(name)

    for name in names:
        place(name)
    classes = [render_class(n, names, schemas) for n in ordered]
    mixins = sorted({MIXINS[sdk_name(n)] for n in ordered if sdk_name(n) in MIXINS})
    # `__all__` lets ipucloud/sdk/models.py export every class without naming it again.
    exported = "__all__ = [" + ", ".join(json.dumps(sdk_name(n)) for n in sorted(ordered, key=sdk_name)) + "]"
    text = HEADER.format(imports=", ".join([*mixins, "Model"])) + "\n" + exported + "\n\n\n"
    text += "\n\n\n".join(classes) + "\n"
    return _formatted(text)


def _formatted(text: str) -> str:
    # The generated file is held to the repository's style like any other.
    ruff = [sys.executable, "-m", "ruff"]
    fixed = subprocess.run(
        [*ruff, "check", "--fix-only", "--quiet", "--stdin-filename", str(OUT_FILE), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return subprocess.run(
        [*ruff, "format", "--quiet", "--stdin-filename", str(OUT_FILE), "-"],
        input=fixed,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def main(argv: list[str]) -> int:
    text = render(json.loads(SPEC_FILE.read_text()))
    if "--check" in argv:
        if not OUT_FILE.exists() or OUT_FILE.read_text() != text:
            print(f"{OUT_FILE} is stale: run `.venv/bin/python -m scripts.gen_sdk_models`", file=sys.stderr)
            return 1
        return 0
    OUT_FILE.write_text(text)
    print(f"wrote {OUT_FILE} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
