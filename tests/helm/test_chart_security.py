"""Who may connect (the NetworkPolicy), what the pods may do (security contexts), and TLS from a Secret."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from tests.helm.conftest import CHART, HERE, NAMESPACE, RELEASE, VALUES, Rendered, pod_environ, values_of
from tests.support.helm import Helm

VALUES_NAMES = [p.stem for p in VALUES]
METADATA_NAME = "kubernetes.io/metadata.name"  # the label Kubernetes puts on every namespace: its name


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    return rendered.one("StatefulSet")["spec"]["template"]["spec"]


def broker_labels(rendered: Rendered) -> dict[str, str]:
    return rendered.one("StatefulSet")["spec"]["template"]["metadata"]["labels"]


def config_toml(rendered: Rendered) -> dict[str, Any]:
    return tomllib.loads(rendered.config_map["data"]["tiered.toml"])


def ports_of(values_name: str) -> dict[str, int]:
    return {"tank": 11011, "http": 9102, **values_of(values_name).get("ports", {})}


# --- a reading of NetworkPolicy semantics, to ask the rendered policy who gets in ---------------------------------

def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector: matchLabels all equal, matchExpressions (In, NotIn, Exists, DoesNotExist) all hold; an
    empty selector selects everything."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for rule in selector.get("matchExpressions", []):
        key, op, values = rule["key"], rule["operator"], rule.get("values", [])
        held = {"In": key in labels and labels[key] in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not held:
            return False
    return True


def peer_admits(peer: dict[str, Any], namespace: str, pod: dict[str, str]) -> bool:
    """A NetworkPolicyPeer: without a namespaceSelector its podSelector looks in the policy's own namespace."""
    assert "ipBlock" not in peer or len(peer) == 1, "ipBlock stands alone in a peer"
    if "ipBlock" in peer:
        return False  # pods are matched by labels here; address ranges are asserted separately
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], {METADATA_NAME: namespace}):
            return False
    elif namespace != NAMESPACE:
        return False
    return selects(peer.get("podSelector", {}), pod)


def admitted(rendered: Rendered, port: int, namespace: str, pod: dict[str, str]) -> bool:
    """Whether a pod with these labels in this namespace may open a TCP connection to a broker's port."""
    policies = [p for p in rendered.of_kind("NetworkPolicy") if selects(p["spec"]["podSelector"],
                                                                        broker_labels(rendered))]
    if not policies:
        return True  # no policy selects the brokers: nothing is isolated
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports):
                continue
            if any(peer_admits(peer, namespace, pod) for peer in rule.get("from", [{}])):
                return True
    return False


# --- the NetworkPolicy ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_network_policy_on_by_default_selects_exactly_the_brokers(render, values_name: str) -> None:
    rendered = render(values_name)
    policy = rendered.one("NetworkPolicy")
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= broker_labels(rendered).items()
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress stays open: catalog, bucket and DNS"
    for job in rendered.of_kind("Job"):
        assert not selects(policy["spec"]["podSelector"], job["spec"]["template"]["metadata"]["labels"])
    # Only the two ports the brokers listen on are opened.
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert opened == set(ports_of(values_name).values())


@pytest.mark.parametrize("values_name", ["minimal", "custom-names"])
def test_default_policy_admits_labelled_clients_of_the_namespace_and_monitoring(render, values_name: str) -> None:
    rendered = render(values_name)
    tank, http = ports_of(values_name)["tank"], ports_of(values_name)["http"]
    client = {"tiered-client": "true", "app": "orders"}
    assert admitted(rendered, tank, NAMESPACE, client)
    assert not admitted(rendered, tank, NAMESPACE, {"app": "orders"}), "an unlabelled pod"
    assert not admitted(rendered, tank, "apps", client), "a labelled pod of another namespace"
    assert not admitted(rendered, http, NAMESPACE, client), "clients do not reach metrics and admin endpoints"
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert admitted(rendered, http, "monitoring", prometheus)
    assert not admitted(rendered, tank, "monitoring", prometheus)
    assert not admitted(rendered, http, "default", prometheus)
    # The brokers reach each other's TANK port (the CLI in a pod follows redirects), not their HTTP port: they never
    # call it.
    assert admitted(rendered, tank, NAMESPACE, broker_labels(rendered))
    assert not admitted(rendered, http, NAMESPACE, broker_labels(rendered))
    # Nothing else is opened: a port the broker does not listen on is refused to everyone.
    assert not admitted(rendered, 5432, NAMESPACE, client)


def test_policy_names_client_namespaces_labels_address_ranges_and_the_scraper(render) -> None:
    rendered = render("tls")
    producer = {"streams.example.com/producer": "yes"}
    for namespace in (NAMESPACE, "apps", "analytics"):
        assert admitted(rendered, 11011, namespace, producer), namespace
    assert not admitted(rendered, 11011, "default", producer)
    assert not admitted(rendered, 11011, NAMESPACE, {"tiered-client": "true"}), "the default label is replaced"
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert admitted(rendered, 9102, "observability", prometheus)
    assert not admitted(rendered, 9102, "observability", {"app.kubernetes.io/name": "grafana"})
    assert not admitted(rendered, 9102, "monitoring", prometheus)
    (tank_rule,) = [r for r in rendered.one("NetworkPolicy")["spec"]["ingress"] if r["ports"][0]["port"] == 11011]
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in tank_rule["from"]
    # The plaintext listener is bound to localhost and its port is not opened: only kubectl exec reaches it.
    assert config_toml(rendered)["listen_plain"] == "127.0.0.1:11012"
    assert not admitted(rendered, 11012, NAMESPACE, producer)


def test_policy_can_be_turned_off(render) -> None:
    rendered = render("minimal", "--set", "networkPolicy.enabled=false")
    assert not rendered.of_kind("NetworkPolicy")
    assert admitted(rendered, 11011, "anywhere", {}), "without a policy nothing is isolated"


def test_notes_tell_which_pods_may_connect(notes) -> None:
    text = notes("minimal")
    assert f"only pods labelled tiered-client=true in namespace {NAMESPACE}" in text
    assert "Port 9102 (metrics) is open to namespace monitoring only" in text
    text = notes("tls")
    assert "streams.example.com/producer=yes" in text and "(and in apps, analytics)" in text


# --- security contexts ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", VALUES_NAMES)
def test_pods_run_as_a_numeric_non_root_user_with_a_read_only_root(render, values_name: str) -> None:
    rendered = render(values_name)
    for obj in [*rendered.of_kind("StatefulSet"), *rendered.of_kind("Job")]:
        spec = obj["spec"]["template"]["spec"]
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and isinstance(pod["runAsUser"], int) and pod["runAsUser"] > 0
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == pod["runAsUser"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert "privileged" not in sc
            # What the broker writes has a volume of its own: the data dir and /tmp; everything else is read-only.
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            writable = {path for path, m in mounts.items() if not m.get("readOnly")}
            if obj["kind"] == "StatefulSet":
                assert writable == {"/var/lib/tiered", "/tmp"}
                assert config_toml(rendered)["data_dir"] == "/var/lib/tiered"


def test_another_uid_may_be_chosen(render) -> None:
    rendered = render("minimal", "--set", "podSecurityContext.runAsUser=20000",
                      "--set", "securityContext.runAsUser=20000")
    assert pod_spec(rendered)["securityContext"]["runAsUser"] == 20000
    assert rendered.broker["securityContext"]["runAsUser"] == 20000
    assert rendered.broker["securityContext"]["readOnlyRootFilesystem"] is True


# --- TLS --------------------------------------------------------------------------------------------------------

def test_tls_off_by_default(render) -> None:
    rendered = render("minimal")
    config = config_toml(rendered)
    assert not {"tls_cert", "tls_key", "tls_client_ca"} & set(config)
    assert "tls" not in {v["name"] for v in pod_spec(rendered)["volumes"]}
    assert "tls" not in {m["name"] for m in rendered.broker["volumeMounts"]}


def test_tls_from_a_secret_with_client_certificates(render, tmp_path) -> None:
    from tiered.config import load_settings
    from tiered.tls import ServerTLS

    rendered = render("tls")
    mounts = {m["name"]: m for m in rendered.broker["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/var/run/tiered-tls", "readOnly": True}, \
        "read-only, and the whole directory (a subPath mount would never see a renewed certificate)"
    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    projected = volumes["tls"]["projected"]
    assert projected["defaultMode"] == 0o440
    server, client_ca = projected["sources"]
    assert server["secret"] == {"name": "tiered-tls", "items": [{"key": "tls.crt", "path": "tls.crt"},
                                                                {"key": "tls.key", "path": "tls.key"}]}
    assert client_ca["secret"] == {"name": "tiered-client-ca", "items": [{"key": "ca.pem", "path": "client-ca.crt"}]}
    # The broker reads the mounted files: its settings, from the rendered config file and environment.
    config_file = tmp_path / "tiered.toml"
    config_file.write_text(rendered.config_map["data"]["tiered.toml"])
    environ = {**pod_environ(rendered.broker), "TIERED_CONFIG": str(config_file)}
    settings = load_settings(environ=environ)
    assert settings.server_tls() == ServerTLS("/var/run/tiered-tls/tls.crt", "/var/run/tiered-tls/tls.key",
                                              "/var/run/tiered-tls/client-ca.crt")
    assert settings.listen_plain == "127.0.0.1:11012"
    # The migration Job never mounts the broker's key.
    for job in rendered.of_kind("Job"):
        assert "tls" not in {v["name"] for v in job["spec"]["template"]["spec"].get("volumes", [])}


def test_tls_without_client_certificates_and_the_ca_from_the_same_secret(render) -> None:
    rendered = render("minimal", "--set", "tls.enabled=true", "--set", "tls.secretName=broker-cert")
    config = config_toml(rendered)
    assert (config["tls_cert"], config["tls_key"]) == ("/etc/tiered-tls/tls.crt", "/etc/tiered-tls/tls.key")
    assert "tls_client_ca" not in config
    (source,) = {v["name"]: v for v in pod_spec(rendered)["volumes"]}["tls"]["projected"]["sources"]
    assert source["secret"]["name"] == "broker-cert"
    rendered = render("minimal", "--set", "tls.enabled=true", "--set", "tls.secretName=broker-cert",
                      "--set", "tls.clientCA.enabled=true")
    assert config_toml(rendered)["tls_client_ca"] == "/etc/tiered-tls/client-ca.crt"
    sources = {v["name"]: v for v in pod_spec(rendered)["volumes"]}["tls"]["projected"]["sources"]
    assert sources[1]["secret"] == {"name": "broker-cert", "items": [{"key": "ca.crt", "path": "client-ca.crt"}]}


def test_tls_changes_roll_the_brokers(render) -> None:
    def checksum(*flags: str) -> str:
        return render("minimal", *flags).one("StatefulSet")["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]

    assert checksum("--set", "tls.enabled=true", "--set", "tls.secretName=c") != checksum()


@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "tls.enabled=true"], "tls.enabled is true but tls.secretName is empty"),
    (["--set", "tls.clientCA.enabled=true"], "tls.clientCA.enabled needs tls.enabled"),
    (["--set", "accessRules.rules=[[rule]]", "--set", "accessRules.existingConfigMap=a"],
     "accessRules has both rules and existingConfigMap"),
])
def test_settings_that_cannot_work_fail_to_render(helm: Helm, flags: list[str], message: str) -> None:
    # The template says why even when the schema is skipped.
    done = helm.run("template", RELEASE, str(CHART), "-f", str(HERE / "values" / "minimal.yaml"),
                    "--skip-schema-validation", *flags)
    assert done.returncode != 0
    assert message in done.stderr


def test_notes_tell_clients_to_speak_tls(notes) -> None:
    text = notes("tls")
    assert "The TANK port speaks TLS only, with the certificate of Secret tiered-tls" in text
    assert "tiered status -b localhost:11011 --tls-ca ca.crt --tls-cert client.crt --tls-key client.key" in text
    assert "speaks TLS" not in notes("minimal")
    # Redirects name pod IPs: the notes say how clients verify those brokers by the service's name instead.
    assert "WARNING" not in text
    assert ("verifies that broker by the name it bootstrapped with, so bootstrap by a name the\ncertificate holds, "
            "e.g. -b rel-tiered.streams.svc.cluster.local:11011, or give the name as --tls-server-name NAME") in text


# --- objects at rest --------------------------------------------------------------------------------------------

def test_objects_at_rest_are_encrypted_as_the_store_values_say(render, tmp_path) -> None:
    from tiered.config import load_settings
    from tiered.tiering.objects.s3_store import ServerSideEncryption
    from tiered.tiering.objects.store import store_options

    assert not {"s3_sse", "s3_sse_kms_key_id"} & set(config_toml(render("minimal")))
    rendered = render("production")
    key = values_of("production")["store"]["kmsKeyId"]
    config = config_toml(rendered)
    assert (config["s3_sse"], config["s3_sse_kms_key_id"]) == ("kms", key)
    config_file = tmp_path / "tiered.toml"
    config_file.write_text(rendered.config_map["data"]["tiered.toml"])
    settings = load_settings(environ={**pod_environ(rendered.broker), "TIERED_CONFIG": str(config_file)})
    assert store_options(settings)["encryption"] == ServerSideEncryption("kms", key)
    config = config_toml(render("minimal", "--set", "store.serverSideEncryption=s3"))
    assert config["s3_sse"] == "s3" and "s3_sse_kms_key_id" not in config


# --- the catalog's CA -------------------------------------------------------------------------------------------

def test_the_catalog_ca_is_mounted_for_the_brokers_and_the_migration_job(render) -> None:
    rendered = render("production")
    for obj in [rendered.one("StatefulSet"), rendered.one("Job")]:
        spec = obj["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PGSSLROOTCERT"] == "/etc/tiered-catalog-ca/global-bundle.pem"
        assert env["PGSSLMODE"] == "verify-full"
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["catalog-ca"] == {"name": "catalog-ca", "mountPath": "/etc/tiered-catalog-ca", "readOnly": True}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["catalog-ca"]["configMap"] == {
            "name": "rds-ca", "items": [{"key": "global-bundle.pem", "path": "global-bundle.pem"}]}
    rendered = render("minimal", "--set", "catalog.rootCA.secret=pg-ca")
    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    assert volumes["catalog-ca"]["secret"] == {"secretName": "pg-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    assert {e["name"]: e.get("value") for e in rendered.broker["env"]}["PGSSLROOTCERT"] == \
        "/etc/tiered-catalog-ca/ca.crt"
    rendered = render("minimal")
    assert not {"PGSSLROOTCERT", "PGSSLMODE"} & {e["name"] for e in rendered.broker["env"]}
    assert "catalog-ca" not in {v["name"] for v in pod_spec(rendered)["volumes"]}


def test_a_catalog_ca_from_two_places_fails_to_render(helm: Helm) -> None:
    done = helm.run("template", RELEASE, str(CHART), "-f", str(HERE / "values" / "minimal.yaml"),
                    "--skip-schema-validation", "--set", "catalog.rootCA.configMap=a", "--set", "catalog.rootCA.secret=b")
    assert done.returncode != 0
    assert "catalog.rootCA names both a configMap and a secret" in done.stderr


# --- access rules -----------------------------------------------------------------------------------------------

def test_access_rules_inline_are_their_own_config_map_mounted_where_acl_points(render, tmp_path) -> None:
    from tiered.acl import Op, allowed, parse_rules
    from tiered.config import load_settings

    rendered = render("tls")
    (acl_map,) = [o for o in rendered.of_kind("ConfigMap") if o is not rendered.config_map]
    assert acl_map["metadata"]["name"] == "rel-tiered-acl"
    rules = parse_rules(acl_map["data"]["acl.toml"], "the rendered ConfigMap")
    assert allowed(rules, "billing", Op.PRODUCE, "billing-eu") and not allowed(rules, "billing", Op.CREATE, "x")
    assert allowed(rules, "anonymous", Op.CONSUME, "orders")
    mounts = {m["name"]: m for m in rendered.broker["volumeMounts"]}
    assert mounts["acl"] == {"name": "acl", "mountPath": "/etc/tiered-acl", "readOnly": True}
    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    assert volumes["acl"]["configMap"] == {"name": "rel-tiered-acl", "items": [{"key": "acl.toml", "path": "acl.toml"}]}
    config_file = tmp_path / "tiered.toml"
    config_file.write_text(rendered.config_map["data"]["tiered.toml"])
    settings = load_settings(environ={**pod_environ(rendered.broker), "TIERED_CONFIG": str(config_file)})
    assert settings.acl == "/etc/tiered-acl/acl.toml"
    # The rules are outside the config file's checksum: the brokers reload them, no restart needed.
    checksum = lambda r: r.one("StatefulSet")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]  # noqa: E731
    assert checksum(render("tls", "--set", "accessRules.rules=[[rule]]")) == checksum(rendered)


def test_access_rules_from_an_existing_config_map_or_none(render) -> None:
    rendered = render("minimal", "--set", "accessRules.existingConfigMap=streams-acl", "--set", "accessRules.key=r.toml")
    assert len(rendered.of_kind("ConfigMap")) == 1
    assert config_toml(rendered)["acl"] == "/etc/tiered-acl/r.toml"
    volumes = {v["name"]: v for v in pod_spec(rendered)["volumes"]}
    assert volumes["acl"]["configMap"] == {"name": "streams-acl", "items": [{"key": "r.toml", "path": "r.toml"}]}
    rendered = render("minimal")
    assert "acl" not in config_toml(rendered)
    assert "acl" not in {v["name"] for v in pod_spec(rendered)["volumes"]}
