"""Several brokers as one service: 1, 3 (the default) and 5 brokers behind the client Service, every pod advertising
its own IP for TANK's redirects, restarts and drains one broker at a time with the SIGTERM handover inside the grace
period, brokers spread over nodes, and no render of several brokers without the PostgreSQL catalog and S3."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.helm.conftest import CHART, HERE, NAMESPACE, POD_FIELDS, RELEASE, Rendered, pod_environ, values_of
from tests.support.helm import Helm

DEFAULTS: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
# values file -> the number of brokers it asks for (minimal keeps the chart's default).
BROKERS = {"one-broker": 1, "minimal": 3, "five-brokers": 5}


def setting(values_name: str, *path: str) -> Any:
    """A value as the chart sees it: the values file's, else the chart default's."""
    for source in (values_of(values_name), DEFAULTS):
        node: Any = source
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node
    raise KeyError(path)


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    return rendered.one("StatefulSet")["spec"]["template"]["spec"]


def test_three_brokers_by_default(render) -> None:
    assert DEFAULTS["replicaCount"] == 3
    assert "replicaCount" not in values_of("minimal")
    assert render("minimal").one("StatefulSet")["spec"]["replicas"] == 3


@pytest.mark.parametrize(("values_name", "brokers"), BROKERS.items())
def test_every_pod_advertises_its_own_ip(render, values_name: str, brokers: int) -> None:
    rendered = render(values_name)
    assert rendered.one("StatefulSet")["spec"]["replicas"] == brokers
    tank = setting(values_name, "ports", "tank")
    env = rendered.broker["env"]
    names = [e["name"] for e in env]
    assert names.count("POD_IP") == names.count("TIERED_ADVERTISE") == 1
    assert env[names.index("POD_IP")] == {"name": "POD_IP",
                                          "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert env[names.index("TIERED_ADVERTISE")] == {"name": "TIERED_ADVERTISE", "value": f"$(POD_IP):{tank}"}
    # The kubelet expands $(POD_IP) only from entries defined before this one.
    assert names.index("POD_IP") < names.index("TIERED_ADVERTISE")
    assert pod_environ(rendered.broker)["TIERED_ADVERTISE"] == f"{POD_FIELDS['status.podIP']}:{tank}"
    # Redirected clients connect to the pod IP directly: the advertised port is the container's TANK port.
    assert {"name": "tank", "containerPort": tank, "protocol": "TCP"} in rendered.broker["ports"]
    assert "advertise" not in rendered.config_map["data"]["tiered.toml"], "per pod, not in the shared file"


@pytest.mark.parametrize("values_name", BROKERS)
def test_client_service_spreads_over_every_ready_broker(render, values_name: str) -> None:
    rendered = render(values_name)
    service = rendered.one("Service", "rel-tiered")
    sts = rendered.one("StatefulSet")
    assert service["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert "sessionAffinity" not in service["spec"] and "publishNotReadyAddresses" not in service["spec"]
    tank = setting(values_name, "ports", "tank")
    assert {"name": "tank", "port": tank, "targetPort": "tank", "protocol": "TCP"} in service["spec"]["ports"]


@pytest.mark.parametrize("values_name", BROKERS)
def test_restarts_replace_one_broker_at_a_time(render, values_name: str) -> None:
    rendered = render(values_name)
    spec = rendered.one("StatefulSet")["spec"]
    # No partition and no maxUnavailable: every pod is updated, one at a time, highest ordinal first.
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["minReadySeconds"] == setting(values_name, "minReadySeconds") > 0
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": spec["selector"]["matchLabels"]}}


@pytest.mark.parametrize("values_name", BROKERS)
def test_sigterm_handover_fits_in_the_grace_period(render, values_name: str) -> None:
    rendered = render(values_name)
    grace = pod_spec(rendered)["terminationGracePeriodSeconds"]
    shutdown = setting(values_name, "shutdownTimeoutSeconds")
    assert grace == setting(values_name, "terminationGracePeriodSeconds") >= shutdown + 5
    assert f'"shutdown_timeout_s" = {shutdown}' in rendered.config_map["data"]["tiered.toml"]
    assert "lifecycle" not in rendered.broker, "SIGTERM itself starts the handover: no preStop hook"


@pytest.mark.parametrize("values_name", BROKERS)
def test_probes_and_lease(render, values_name: str) -> None:
    rendered = render(values_name)
    assert rendered.broker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert rendered.broker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    lease = setting(values_name, "config", "cluster_lease_ms")
    assert f'"cluster_lease_ms" = {lease}' in rendered.config_map["data"]["tiered.toml"]


@pytest.mark.parametrize(("values_name", "rule"), [("minimal", "preferred"), ("one-broker", "preferred"),
                                                   ("five-brokers", "required")])
def test_brokers_spread_over_nodes(render, values_name: str, rule: str) -> None:
    rendered = render(values_name)
    anti = pod_spec(rendered)["affinity"]["podAntiAffinity"]
    (key,) = anti
    assert key == f"{rule}DuringSchedulingIgnoredDuringExecution"
    (term,) = anti[key]
    if rule == "preferred":
        assert term["weight"] == 100
        term = term["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == rendered.one("StatefulSet")["spec"]["selector"]["matchLabels"]


@pytest.mark.parametrize(("values_name", "flags", "message"), [
    ("minimal", ["--set", "catalog.url=sqlite:////var/lib/tiered/catalog.db"],
     "replicaCount is 3 but catalog.url is a sqlite: URL, not PostgreSQL"),
    ("minimal", ["--set", "catalog.url="], "replicaCount is 3 but catalog.url is empty, not PostgreSQL"),
    ("five-brokers", ["--set", "store.url=file:///var/lib/tiered/objects"],
     "replicaCount is 5 but store.url is a file: URL, not S3"),
    ("minimal", ["--set", "store.url=tiered-segments"], "replicaCount is 3 but store.url is not a URL, not S3"),
])
def test_several_brokers_need_postgresql_and_s3(helm: Helm, values_name: str, flags: list[str],
                                                message: str) -> None:
    """The schema refuses these first; the chart's own check says why, also when the schema is skipped (helm
    lint only logs a template's `fail`, so `helm template` is what shows it)."""
    values = HERE / "values" / f"{values_name}.yaml"
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values), *flags]
    checked = helm.run(*args)
    assert checked.returncode != 0 and "don't meet the specifications of the schema" in checked.stderr
    skipped = helm.run(*args, "--skip-schema-validation")
    assert skipped.returncode != 0, f"helm template rendered several brokers with {flags}"
    assert message in skipped.stderr, skipped.stderr
    reason = "a SQLite catalog refuses a second broker" if "catalog" in message else "s3://BUCKET/PREFIX"
    assert reason in skipped.stderr


def test_notes_explain_several_brokers(notes) -> None:
    text = " ".join(notes("minimal").split())  # the paragraphs are wrapped
    assert "with 3 broker(s), serving as one service" in text
    assert "Any broker answers any client" in text
    assert "redirect (0xfc) to that broker's pod IP and port 11011" in text
    assert "replicaCount > 1 requires both" in text and "PostgreSQL catalog" in text
    assert "config.cluster_lease_ms = 10000 ms) plus about 2 s" in text
    assert f"kubectl --namespace {NAMESPACE} rollout restart statefulset/rel-tiered" in text
    assert "This loses no acknowledged message" in text and "ready for 10 s" in text
    assert "no preStop hook" in text and "PodDisruptionBudget" in text
    # The command reads the catalog, whose URL the pod's environment names (TIERED_CATALOG_URL): no flag needed.
    assert f"kubectl --namespace {NAMESPACE} exec statefulset/rel-tiered -- tiered cluster status " in text
    assert "cluster status -b" not in text
    five = " ".join(notes("five-brokers").split())
    assert "cluster_lease_ms = 6000 ms" in five and "ready for 20 s" in five
    assert "tiered cluster status" in five and "pod IP and port 12011" in five
    one = " ".join(notes("one-broker").split())
    assert "with 1 broker(s)." in one and "With one broker, a restart pauses the service" in one
    assert "redirect" not in one and "loses no acknowledged message" not in one


def test_the_notices_url_reaches_the_brokers_only_when_set(render) -> None:
    """catalog.noticesUrl (catalog_notices_url): rendered into the brokers' environment when set, never into the
    migration Job's (it listens to nothing), and not at all when empty."""
    direct = "postgresql+psycopg://tiered@postgres:5432/tiered"
    rendered = render("minimal", "--set", "catalog.url=postgresql+psycopg://tiered@pgbouncer:6432/tiered?pooled=true",
                      "--set", f"catalog.noticesUrl={direct}")
    assert pod_environ(rendered.broker)["TIERED_CATALOG_NOTICES_URL"] == direct
    (job,) = rendered.one("Job")["spec"]["template"]["spec"]["containers"]
    assert "TIERED_CATALOG_NOTICES_URL" not in pod_environ(job)
    assert "TIERED_CATALOG_NOTICES_URL" not in pod_environ(render("minimal").broker)
