"""What the rendered objects say: probes, volumes, secrets, the migration hook, security, PDB, config, NOTES."""

from __future__ import annotations

import re
import tomllib
from typing import Any, Iterator

import pytest
import yaml

from tests.helm.conftest import (CHART, HERE, NAMESPACE, POD_FIELDS, RELEASE, VALUES, Rendered, pod_environ,
                                 values_of)
from tests.support.helm import REPO_ROOT, Helm

VALUES_NAMES = [p.stem for p in VALUES]
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
SECRETISH = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
URL_WITH_PASSWORD = re.compile(r"://[^/@:\s]+:[^/@\s]+@")


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def secret_ref(env: dict[str, dict[str, Any]], name: str) -> tuple[str, str]:
    ref = env[name]["valueFrom"]["secretKeyRef"]
    assert "value" not in env[name]
    return ref["name"], ref["key"]


def config_toml(rendered: Rendered) -> dict[str, Any]:
    return tomllib.loads(rendered.config_map["data"]["tiered.toml"])


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def all_strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from all_strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from all_strings(v)


def documented_settings() -> set[str]:
    """The config file keys of the settings contract, from docs/configuration.md's table."""
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    return set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, re.MULTILINE))


# --- names, labels, selectors ---------------------------------------------------------------------------------

def test_default_names_and_image(render) -> None:
    rendered = render("minimal")
    sts = rendered.one("StatefulSet", "rel-tiered")
    assert sts["spec"]["serviceName"] == "rel-tiered-headless"
    assert rendered.one("Service", "rel-tiered-headless")["spec"]["clusterIP"] == "None"
    assert rendered.broker["image"] == f"tiered:{APP_VERSION}"
    assert rendered.broker["args"] == ["serve"]


def test_custom_names_labels_and_image_digest(render) -> None:
    rendered = render("custom-names")
    values = values_of("custom-names")
    names = {(o["kind"], o["metadata"]["name"]) for o in rendered.objects}
    assert ("StatefulSet", "acme-streams") in names
    assert ("Service", "acme-streams-headless") in names
    assert ("Job", "acme-streams-db-upgrade") in names
    assert not rendered.of_kind("ServiceAccount"), "serviceAccount.create=false must not create one"
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "streams"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == f"tiered-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}"
        assert values["commonLabels"].items() <= labels.items()
    pod = rendered.one("StatefulSet")["spec"]["template"]
    assert values["podLabels"].items() <= pod["metadata"]["labels"].items()
    assert values["podAnnotations"].items() <= pod["metadata"]["annotations"].items()
    assert pod["spec"]["serviceAccountName"] == "streams-broker"
    assert rendered.broker["image"] == f"registry.example.com/tiered@{values['image']['digest']}"
    service = rendered.one("Service", "acme-streams")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert pod["spec"]["nodeSelector"] == values["nodeSelector"]
    assert pod["spec"]["tolerations"] == values["tolerations"]


@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_services_and_pdb_select_exactly_the_brokers(render, values_name: str) -> None:
    rendered = render(values_name)
    sts = rendered.one("StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    selectors = [s["spec"]["selector"] for s in rendered.of_kind("Service")]
    selectors += [p["spec"]["selector"]["matchLabels"] for p in rendered.of_kind("PodDisruptionBudget")]
    assert len(selectors) >= 2
    for job in rendered.of_kind("Job"):
        job_labels = job["spec"]["template"]["metadata"]["labels"]
        for selector in selectors:
            assert not selector.items() <= job_labels.items(), "the migration pod must not be selected"
    for selector in selectors:
        assert selector.items() <= pod_labels.items()


# --- ports and probes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", ["minimal", "custom-names"])
def test_ports_and_probes(render, values_name: str) -> None:
    rendered = render(values_name)
    ports = {"tank": 11011, "http": 9102, **values_of(values_name).get("ports", {})}
    container = rendered.broker
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == ports
    probes = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe_name, path in probes.items():
        assert container[probe_name]["httpGet"] == {"path": path, "port": "http"}, probe_name
    for service in rendered.of_kind("Service"):
        assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
            name: (number, name) for name, number in ports.items()}
    config = config_toml(rendered)
    assert config["listen"] == f":{ports['tank']}"
    assert config["http_listen"] == f":{ports['http']}"


def test_startup_probe_can_be_disabled(render) -> None:
    container = render("ephemeral").broker
    assert "startupProbe" not in container
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_headless_service_publishes_brokers_that_are_not_ready(render) -> None:
    headless = render("minimal").one("Service", "rel-tiered-headless")
    assert headless["spec"]["publishNotReadyAddresses"] is True


# --- volumes ----------------------------------------------------------------------------------------------------

def test_volume_claim_template_per_broker(render) -> None:
    rendered = render("production")
    sts = rendered.one("StatefulSet")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "500Gi"
    assert claim["spec"]["storageClassName"] == "gp3"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    mounts = {m["name"]: m for m in rendered.broker["volumeMounts"]}
    assert mounts["data"]["mountPath"] == "/var/lib/tiered" == config_toml(rendered)["data_dir"]
    assert "data" not in {v["name"] for v in pod_spec(sts)["volumes"]}, "data must come from the claim template"
    assert "storageClassName" not in render("minimal").one("StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]


def test_persistence_disabled_uses_an_empty_dir(render) -> None:
    sts = render("ephemeral").one("StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_config_file_is_mounted_read_only_where_tiered_config_points(render, values_name: str) -> None:
    rendered = render(values_name)
    mounts = {m["name"]: m for m in rendered.broker["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered.one("StatefulSet"))["volumes"]}
    configmap = rendered.config_map
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert mounts["config"]["readOnly"] is True
    (key,) = configmap["data"]
    assert env_of(rendered.broker)["TIERED_CONFIG"]["value"] == f"{mounts['config']['mountPath']}/{key}"
    assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]


# --- config file ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_config_file_speaks_the_settings_contract(render, values_name: str) -> None:
    rendered = render(values_name)
    values = values_of(values_name)
    config = config_toml(rendered)
    topic_defaults = config.pop("topic_defaults")
    unknown = set(config) - documented_settings()
    assert not unknown, f"keys not in docs/configuration.md: {unknown}"
    assert config["store_url"] == values["store"]["url"]
    assert config["s3_path_style"] is values["store"].get("pathStyle", False)
    assert config["broker_id"] == "auto"
    assert config["data_dir"] == "/var/lib/tiered"
    grace = pod_spec(rendered.one("StatefulSet"))["terminationGracePeriodSeconds"]
    assert config["shutdown_timeout_s"] == values.get("shutdownTimeoutSeconds", 25) < grace
    for key, value in values.get("config", {}).items():
        assert config[key] == value
    # TANK's dotted keys stay flat keys, not nested TOML tables.
    assert topic_defaults == values.get("topicDefaults", {})
    assert "catalog_url" not in config, "the catalog URL travels in TIERED_CATALOG_URL"


@pytest.mark.parametrize("grace", [20, 24])
def test_shutdown_timeout_must_fit_in_the_grace_period(helm: Helm, grace: int) -> None:
    done = helm.run("template", RELEASE, str(CHART), "-f", str(HERE / "values" / "minimal.yaml"),
                    "--set", f"terminationGracePeriodSeconds={grace}", "--set", "shutdownTimeoutSeconds=20")
    assert done.returncode != 0
    assert (f"terminationGracePeriodSeconds ({grace}) must be at least shutdownTimeoutSeconds (20) + 5"
            in done.stderr)


def test_grace_period_of_shutdown_timeout_plus_five_seconds_renders(render) -> None:
    rendered = render("minimal", "--set", "terminationGracePeriodSeconds=25", "--set", "shutdownTimeoutSeconds=20")
    assert pod_spec(rendered.one("StatefulSet"))["terminationGracePeriodSeconds"] == 25
    assert config_toml(rendered)["shutdown_timeout_s"] == 20


def test_config_checksum_rolls_pods_on_config_change_only(render) -> None:
    def checksum(*flags: str) -> str:
        return render("minimal", *flags).one("StatefulSet")["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]

    base = checksum()
    assert re.fullmatch(r"[0-9a-f]{64}", base)
    assert checksum("--set", "config.log_level=debug") != base
    assert checksum("--set-json", 'topicDefaults={"retention.segments.count":3}') != base
    assert checksum("--set", "store.url=s3://another-bucket/prefix") != base
    assert checksum("--set", "resources.requests.cpu=2") == base


# --- secrets ----------------------------------------------------------------------------------------------------

def test_catalog_password_and_iam_role(render) -> None:
    rendered = render("production")
    env = env_of(rendered.broker)
    assert secret_ref(env, "PGPASSWORD") == ("tiered-catalog", "password")
    assert env["TIERED_CATALOG_URL"]["value"] == values_of("production")["catalog"]["url"]
    assert env["AWS_REGION"]["value"] == "eu-west-1"
    assert "AWS_ACCESS_KEY_ID" not in env and "AWS_SECRET_ACCESS_KEY" not in env, "IRSA: no static keys"
    account = rendered.one("ServiceAccount")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/tiered-broker"}
    assert pod_spec(rendered.one("StatefulSet"))["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False


def test_s3_path_style_store_with_static_credentials(render) -> None:
    rendered = render("s3-path-style")
    env = env_of(rendered.broker)
    assert secret_ref(env, "AWS_ACCESS_KEY_ID") == ("minio-credentials", "AWS_ACCESS_KEY_ID")
    assert secret_ref(env, "AWS_SECRET_ACCESS_KEY") == ("minio-credentials", "AWS_SECRET_ACCESS_KEY")
    assert secret_ref(env, "AWS_SESSION_TOKEN") == ("minio-credentials", "AWS_SESSION_TOKEN")
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage.svc.cluster.local:9000"
    assert config_toml(rendered)["s3_path_style"] is True
    assert secret_ref(env, "PGPASSWORD") == ("tiered-pg", "password")


def test_custom_secret_key_names(render) -> None:
    env = env_of(render("custom-names").broker)
    assert secret_ref(env, "PGPASSWORD") == ("pg-streams", "pg-password")
    assert secret_ref(env, "AWS_ACCESS_KEY_ID") == ("streams-s3", "access-key")
    assert secret_ref(env, "AWS_SECRET_ACCESS_KEY") == ("streams-s3", "secret-key")
    assert "AWS_SESSION_TOKEN" not in env
    assert secret_ref(env, "HTTPS_PROXY") == ("egress-proxy", "url")
    assert env["PGSSLMODE"]["value"] == "require"


@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_no_secret_values_in_rendered_objects(render, values_name: str) -> None:
    rendered = render(values_name)
    assert not rendered.of_kind("Secret"), "the chart only references existing Secrets"
    for obj in rendered.objects:
        for text in all_strings(obj):
            assert not URL_WITH_PASSWORD.search(text), f"{obj['kind']}: a URL with a password: {text}"
        if obj["kind"] in ("StatefulSet", "Job"):
            for container in pod_spec(obj)["containers"]:
                for name, entry in env_of(container).items():
                    if SECRETISH.search(name) or name == "AWS_ACCESS_KEY_ID":
                        assert set(entry) == {"name", "valueFrom"} and "secretKeyRef" in entry["valueFrom"], entry
    config = config_toml(rendered)
    for key in [*config, *config["topic_defaults"]]:
        assert not SECRETISH.search(key), key


# --- the migration hook ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", ["minimal", "production", "custom-names", "s3-path-style"])
def test_migration_job_is_a_pre_install_and_pre_upgrade_hook(render, values_name: str) -> None:
    rendered = render(values_name)
    (job,) = rendered.of_kind("Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
    assert int(annotations["helm.sh/hook-weight"]) < 0
    assert job["spec"]["backoffLimit"] == 3
    spec = pod_spec(job)
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["args"] == ["db", "upgrade", "--catalog", "$(TIERED_CATALOG_URL)"]
    assert container["image"] == rendered.broker["image"]
    job_env, broker_env = env_of(container), env_of(rendered.broker)
    assert job_env["TIERED_CATALOG_URL"] == broker_env["TIERED_CATALOG_URL"]
    assert job_env.get("PGPASSWORD") == broker_env.get("PGPASSWORD")
    assert not {n for n in job_env if n.startswith("AWS_")}, "migrations need no object store access"
    assert spec["securityContext"] == pod_spec(rendered.one("StatefulSet"))["securityContext"]
    assert container["securityContext"] == rendered.broker["securityContext"]
    assert spec["automountServiceAccountToken"] is False


def test_migration_job_service_account(render) -> None:
    # A hook runs before the chart's own ServiceAccount exists, so the Job only names one the user brought.
    assert "serviceAccountName" not in pod_spec(render("minimal").one("Job"))
    assert pod_spec(render("custom-names").one("Job"))["serviceAccountName"] == "streams-broker"


def test_migrations_can_be_disabled(render) -> None:
    assert not render("ephemeral").of_kind("Job")


# --- security, scheduling, disruption ---------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_security_context(render, values_name: str) -> None:
    rendered = render(values_name)
    for obj in [*rendered.of_kind("StatefulSet"), *rendered.of_kind("Job")]:
        pod = pod_spec(obj)["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert pod["runAsUser"] == pod["runAsGroup"] == pod["fsGroup"] == 10001
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod_spec(obj)["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True
            assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp"}


def test_resources_and_grace_period_from_values(render) -> None:
    rendered = render("production")
    values = values_of("production")
    assert rendered.broker["resources"] == values["resources"]
    sts = rendered.one("StatefulSet")
    assert sts["spec"]["replicas"] == 3
    assert pod_spec(sts)["terminationGracePeriodSeconds"] == 60
    assert pod_spec(sts)["priorityClassName"] == "high-priority"
    assert pod_spec(sts)["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod_spec(sts)["topologySpreadConstraints"] == values["topologySpreadConstraints"]
    assert pod_spec(sts)["enableServiceLinks"] is False
    assert pod_spec(rendered.one("Job"))["enableServiceLinks"] is False


def test_pod_anti_affinity(render) -> None:
    soft = pod_spec(render("minimal").one("StatefulSet"))["affinity"]["podAntiAffinity"]
    (term,) = soft["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "broker"
    hard = pod_spec(render("custom-names").one("StatefulSet"))["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard
    assert "affinity" not in pod_spec(render("ephemeral").one("StatefulSet"))


def test_pod_disruption_budget(render) -> None:
    pdb = render("minimal").one("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    pdb = render("ephemeral").one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in pdb["spec"]


def test_service_monitor_only_when_enabled(render) -> None:
    assert not render("minimal").of_kind("ServiceMonitor")
    rendered = render("production")
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "http", "path": "/metrics", "scheme": "http", "interval": "15s",
                        "scrapeTimeout": "5s"}


# --- NOTES ------------------------------------------------------------------------------------------------------

def test_notes_tell_how_to_reach_the_broker(notes) -> None:
    text = notes("minimal")
    assert f"rel-tiered.{NAMESPACE}.svc.cluster.local:11011" in text
    assert f"rel-tiered-0.rel-tiered-headless.{NAMESPACE}.svc.cluster.local:11011" in text
    assert f"kubectl --namespace {NAMESPACE} port-forward svc/rel-tiered 11011:11011 9102:9102" in text
    assert "tiered status -b localhost:11011" in text
    assert "catalog.existingSecret is empty" in text


def test_notes_list_every_broker(notes) -> None:
    text = notes("production")
    for ordinal in range(3):
        assert f"rel-tiered-{ordinal}.rel-tiered-headless.{NAMESPACE}.svc.cluster.local:11011" in text
    assert "rel-tiered-3." not in text
    assert f"kubectl --namespace {NAMESPACE} port-forward pod/rel-tiered-1 11011:11011" in text
    assert "port-forward pod/" not in notes("one-broker")
    assert "existingSecret is empty" in text and "ServiceAccount annotations are set" in text
    custom = notes("custom-names")
    assert "tiered status -b localhost:12000" in custom
    assert "existingSecret is empty" not in custom


# --- the broker reads what the chart writes -------------------------------------------------------------------

@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_broker_settings_load_from_the_rendered_pod(render, values_name: str, tmp_path) -> None:
    """tiered.config builds its settings from the rendered config file and the pod's plain environment."""
    from tiered.config import load_settings, parse_broker_id

    rendered = render(values_name)
    values = values_of(values_name)
    config_file = tmp_path / "tiered.toml"
    config_file.write_text(rendered.config_map["data"]["tiered.toml"])
    environ = pod_environ(rendered.broker)
    environ["TIERED_CONFIG"] = str(config_file)
    settings = load_settings(environ=environ)
    ports = {"tank": 11011, "http": 9102, **values.get("ports", {})}
    assert settings.listen_endpoint()[1] == ports["tank"]
    assert settings.http_endpoint()[1] == ports["http"]
    assert settings.advertise == f"{POD_FIELDS['status.podIP']}:{ports['tank']}"
    assert settings.cluster_lease_ms == values.get("config", {}).get("cluster_lease_ms", 10_000)
    assert settings.catalog_url == values["catalog"]["url"]
    assert settings.store_url == values["store"]["url"]
    assert str(settings.data_dir) == "/var/lib/tiered"
    assert settings.shutdown_timeout_s < pod_spec(rendered.one("StatefulSet"))["terminationGracePeriodSeconds"]
    assert settings.topic_defaults == {k: str(v) for k, v in values.get("topicDefaults", {}).items()}
    sts = rendered.one("StatefulSet")
    pod_names = [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]
    assert [parse_broker_id("auto", name) for name in pod_names] == list(range(len(pod_names)))
