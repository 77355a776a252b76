"""The Helm chart renders, with Helm's own engine (Helm 4's Go SDK through the `helm-python-sdk`
wheel: no helm binary, no cluster), into objects that pass the Kubernetes schemas, and holds the same
promises as the Compose file: real commands, real settings, required secrets. About 3 s."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.checks import DEPLOY, check_ipucloud_command, required_in_production, setting_names
from tests.support.services import unavailable

CHART = DEPLOY / "helm" / "ipucloud"
KUBERNETES = "1.30.0"
VALUES = {
    "secrets": {
        "secretKey": "s" * 48,
        "databaseUrl": "postgresql://ipucloud:pw@db:5432/ipucloud",
        "redisUrl": "redis://redis:6379/0",
    }
}


def _helm() -> Any:
    try:
        import helm_python
    except (ImportError, OSError) as exc:  # the wheel carries a native library
        unavailable(f"helm-python-sdk is not installed (it is in the `dev` extra): {exc}")
    return helm_python


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    helm = _helm()
    manifests = helm.Chart.load(str(CHART)).render(values, name="ipucloud", namespace="ipu", is_install=True)
    return [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(VALUES)


def test_lint_is_clean() -> None:
    report = _helm().lint(str(CHART), VALUES, strict=True)
    assert not report["errors"], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


def test_every_object_passes_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "Deployment",
        "Job",
        "Secret",
        "Secret",
        "Service",
        "Service",
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def test_the_validator_catches_a_broken_object(objects: list[dict[str, Any]]) -> None:
    import kubernetes_validate

    broken = yaml.safe_load(yaml.safe_dump(by_kind(objects, "Deployment")["ipucloud-api"]))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return obj["spec"]["template"]["spec"]["containers"]


def test_components_run_real_commands_with_probes(objects: list[dict[str, Any]]) -> None:
    deployments = by_kind(objects, "Deployment")
    commands = {}
    for name, dep in deployments.items():
        (c,) = _containers(dep)
        commands[name] = check_ipucloud_command(c["args"])
        assert c["livenessProbe"], name
        pod = dep["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert commands == {
        "ipucloud-api": "api",
        "ipucloud-vipu": "vipu-server",
        "ipucloud-scheduler": "scheduler",
        "ipucloud-worker-general": "worker",
        "ipucloud-notifier": "notifier",
    }
    api = _containers(deployments["ipucloud-api"])[0]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployments["ipucloud-scheduler"]["spec"]["replicas"] == 2
    # Jobs are told the V-IPU endpoint's Service name and port, which it listens on.
    vipu = _containers(deployments["ipucloud-vipu"])[0]
    assert vipu["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = by_kind(objects, "ConfigMap")["ipucloud-config"]
    assert config["data"]["IPUCLOUD_VIPU_API_HOST"] == "ipucloud-vipu"
    services = by_kind(objects, "Service")
    port = services["ipucloud-vipu"]["spec"]["ports"][0]["port"]
    assert port == int(config["data"]["IPUCLOUD_VIPU_API_PORT"])
    (job,) = by_kind(objects, "Job").values()
    assert check_ipucloud_command(_containers(job)[0]["args"]) == "migrate"
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"


def test_settings_are_real_and_secrets_hold_the_required_ones(objects: list[dict[str, Any]]) -> None:
    known, required = setting_names(), required_in_production()
    secrets = by_kind(objects, "Secret")
    configs = by_kind(objects, "ConfigMap")
    for cm in configs.values():
        assert set(cm["data"]) <= known, set(cm["data"]) - known
    for secret in secrets.values():
        assert set(secret["data"]) == required
    for dep in [*by_kind(objects, "Deployment").values(), *by_kind(objects, "Job").values()]:
        refs = {r.get("secretRef", {}).get("name") for r in _containers(dep)[0]["envFrom"]} - {None}
        cms = {r.get("configMapRef", {}).get("name") for r in _containers(dep)[0]["envFrom"]} - {None}
        assert refs <= set(secrets) and cms <= set(configs) and refs and cms, dep["metadata"]["name"]


def test_secrets_are_required_or_brought_by_the_admin() -> None:
    with pytest.raises(Exception, match=r"secrets\.secretKey is required"):
        render({})
    objects = render({"existingSecret": "ipucloud-prod"})
    assert not by_kind(objects, "Secret"), "the chart makes no Secret when the admin brings one"
    for dep in [*by_kind(objects, "Deployment").values(), *by_kind(objects, "Job").values()]:
        assert {"secretRef": {"name": "ipucloud-prod"}} in _containers(dep)[0]["envFrom"]


def test_worker_pools_per_site_scale_and_pin() -> None:
    pools = [
        {"name": "general", "replicas": 3, "queues": "ipucloud", "concurrency": 4},
        {
            "name": "site-b",
            "replicas": 2,
            "queues": "pod0002,pod0003,bow",
            "concurrency": 8,
            "nodeSelector": {"topology.kubernetes.io/zone": "site-b"},
        },
    ]
    objects = render({**VALUES, "workers": {"graceSeconds": 10, "pools": pools}})
    workers = {n: d for n, d in by_kind(objects, "Deployment").items() if "-worker-" in n}
    assert set(workers) == {"ipucloud-worker-general", "ipucloud-worker-site-b"}
    site = workers["ipucloud-worker-site-b"]
    assert site["spec"]["replicas"] == 2
    assert site["spec"]["template"]["spec"]["nodeSelector"] == {"topology.kubernetes.io/zone": "site-b"}
    args = _containers(site)[0]["args"]
    assert args[args.index("--queues") + 1] == "pod0002,pod0003,bow"
    assert workers["ipucloud-worker-general"]["spec"]["replicas"] == 3
