"""The chart lints, renders objects Kubernetes accepts, and its values schema refuses bad values."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.helm.conftest import BAD_VALUES, CHART, HERE, KUBE_VERSION, NAMESPACE, VALUES, Rendered
from tests.support.helm import REPO_ROOT, Helm

VALUES_NAMES = [p.stem for p in VALUES]

# What the chart relies on of the Prometheus Operator's ServiceMonitor CRD (monitoring.coreos.com/v1), which
# kubernetes-validate cannot know: the fields we render, with the operator's own types and formats.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"},
                                                   "minProperties": 1}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?"
                                         "(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?"
                                              "(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                        },
                    },
                },
            },
        },
    },
}


def validate_service_monitor(monitor: dict[str, Any], rendered: Rendered) -> None:
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    # It must select exactly one of our Services, and scrape a port that Service names.
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in rendered.of_kind("Service") if selector.items() <= s["metadata"]["labels"].items()]
    assert len(services) == 1, [s["metadata"]["name"] for s in services]
    port_names = {p["name"] for p in services[0]["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_lint_strict(helm: Helm, values_name: str) -> None:
    out = helm.check("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                     "-f", str(HERE / "values" / f"{values_name}.yaml"))
    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_rendered_objects_are_valid_kubernetes(render, values_name: str) -> None:
    rendered = render(values_name)
    kinds = {o["kind"] for o in rendered.objects}
    assert {"StatefulSet", "Service", "ConfigMap"} <= kinds
    for obj in rendered.objects:
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
        if obj["kind"] == "ServiceMonitor":
            validate_service_monitor(obj, rendered)
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{values_name}: {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


def test_service_monitor_schema_catches_mistakes(render) -> None:
    """The hand-written ServiceMonitor check is not vacuous: a wrong field or type fails it."""
    rendered = render("production")
    monitor = rendered.one("ServiceMonitor")
    validate_service_monitor(monitor, rendered)
    broken = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"port": 9102}]}}
    with pytest.raises(jsonschema.ValidationError):
        validate_service_monitor(broken, rendered)
    misspelt = {**monitor, "spec": {**monitor["spec"], "endpoint": monitor["spec"]["endpoints"]}}
    with pytest.raises(jsonschema.ValidationError):
        validate_service_monitor(misspelt, rendered)


def test_kubernetes_validate_is_strict(render) -> None:
    """An unknown field in a core object fails validation, so the matrix above can catch typos."""
    statefulset = render("minimal").one("StatefulSet")
    typo = {**statefulset, "spec": {**statefulset["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBE_VERSION, strict=True)


def test_schema_config_keys_follow_the_settings_contract() -> None:
    """values.config takes exactly the documented settings; the ones the chart owns are refused by name."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", (REPO_ROOT / "docs" / "configuration.md").read_text(),
                                re.MULTILINE)) - {"topic_defaults"}
    assert set(schema["properties"]) == documented
    owned = {key for key, rule in schema["properties"].items() if rule is False}
    assert owned == {"data_dir", "listen", "http_listen", "catalog_url", "catalog_notices_url", "store_url", "s3_path_style", "broker_id",
                     "shutdown_timeout_s", "advertise", "tls_cert", "tls_key", "tls_client_ca", "s3_sse",
                     "s3_sse_kms_key_id", "acl"}
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[p.stem for p in BAD_VALUES])
def test_schema_rejects_bad_values(helm: Helm, bad) -> None:
    """Each bad values file starts with `# expect: <text>`, a part of the schema error it must cause."""
    first_line = bad.read_text().splitlines()[0]
    assert first_line.startswith("# expect: "), f"{bad.name} must start with '# expect: ...'"
    expected = first_line.removeprefix("# expect: ")
    for command in (["template", "rel", str(CHART)], ["lint", str(CHART)]):
        done = helm.run(*command, "--namespace", NAMESPACE, "-f", str(bad))
        output = done.stdout + done.stderr
        assert done.returncode != 0, f"helm {command[0]} accepted {bad.name}"
        assert "don't meet the specifications of the schema" in output, output
        assert expected in output, output
