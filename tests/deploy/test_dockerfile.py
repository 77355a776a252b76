"""The container image definition: multi-stage, a non-root runtime user, the CLI as entrypoint, and a
build context that holds every package the wheel needs. No Docker engine runs here, so the
Dockerfile is checked, not built. Well under a second."""

from __future__ import annotations

import fnmatch
import json
import tomllib

from tests.deploy.checks import DEPLOY, ROOT

DOCKERFILE = DEPLOY / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.rstrip("\\").strip() if current else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            op, _, rest = current.partition(" ")
            lines.append((op.upper(), rest.strip()))
            current = ""
    return lines


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for op, rest in _instructions():
        if op == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((op, rest))
    return stages


def test_multi_stage_with_a_slim_non_root_runtime() -> None:
    stages = _stages()
    assert len(stages) >= 2
    names = [rest.split()[-1] for op, rest in (s[0] for s in stages)]
    assert names == ["build", "runtime"]
    runtime = dict(stages[-1])
    user = runtime["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric, non-root user (runAsNonRoot can check it)"
    assert json.loads(runtime["ENTRYPOINT"]) == ["ipucloud"]
    copies = [rest for op, rest in stages[-1] if op == "COPY"]
    assert copies == ["--from=build /opt/ipucloud /opt/ipucloud"], "only the built environment ships"


def test_the_build_context_holds_every_package() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"][
        "wheel"
    ]["packages"]
    build = _stages()[0]
    copied = {src for op, rest in build if op == "COPY" for src in rest.split()[:-1]}
    assert {"pyproject.toml", "README.md", *packages} <= copied
    ignore = [p.strip() for p in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()]
    patterns = [p for p in ignore if p and not p.startswith("#")]

    def included(path: str) -> bool:
        keep = True
        for p in patterns:
            negate = p.startswith("!")
            pat = p[1:] if negate else p
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.removesuffix("/**") + "/*"):
                keep = negate
        return keep

    for src in copied:
        assert (ROOT / src).exists(), src
        probe = src if (ROOT / src).is_file() else f"{src}/__init__.py"
        assert included(probe), f"{probe} is excluded from the build context"
    assert not included("tests/conftest.py") and not included(".venv/bin/python")
    assert any("[postgres]" in rest for op, rest in build if op == "RUN"), "the image needs psycopg"


def test_every_deploy_file_is_documented() -> None:
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md":
            rel = path.relative_to(DEPLOY)
            # A file is documented by its path, its name, or its chart's folder.
            chart = len(rel.parts) > 2 and f"{rel.parts[0]}/{rel.parts[1]}/" in readme
            named = str(rel) in readme or path.name in readme or chart
            assert named, f"deploy/{rel} is not described in deploy/README.md"
