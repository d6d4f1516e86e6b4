"""deploy/kubernetes: valid against the Kubernetes API schemas, and true to what the programs do.

The schemas come with kubernetes-validate (offline). The rest checks what a schema
cannot: the probes hit routes the server serves, the command lines parse with the real
parsers, secrets come from Secrets, and the agent sees the host it is meant to tune.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from stortune.server.api.security import api_routes
from stortune.server.app import create_app
from stortune.server.cli import DB_ENV
from stortune.server.settings import Settings
from tests.deployfiles import DEPLOY, parse_command
from tests.server.support import TestClient

K8S = DEPLOY / "kubernetes"
POOL = K8S / "pools" / "streamers"
POOL_KEY = "stortune.example/pool"
#: The oldest Kubernetes still commonly run, and the newest the installed schemas know.
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
Doc = dict[str, Any]


def kustomization(directory: Path = K8S) -> Doc:
    doc: Doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    return doc


def resources(directory: Path = K8S) -> list[tuple[Path, Doc]]:
    """The documents the kustomization at ``directory`` gathers, directories followed."""
    out = []
    for name in kustomization(directory)["resources"]:
        path = (directory / name).resolve()
        if path.is_dir():
            out += resources(path)
        else:
            out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def images(directory: Path = K8S) -> set[str]:
    """The image names the kustomization at ``directory`` and those below it rewrite."""
    found = {i["name"] for i in kustomization(directory).get("images", [])}
    for name in kustomization(directory)["resources"]:
        if (directory / name).is_dir():
            found |= images((directory / name).resolve())
    return found


def the(kind: str) -> Doc:
    (doc,) = [doc for _, doc in resources() if doc["kind"] == kind]
    return doc


def json_patch(doc: Doc, ops: list[Doc]) -> Doc:
    """The add and replace operations of RFC 6902 that the pool overlays use."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op["op"] == "add":
                target.insert(index, op["value"])
            else:
                assert op["op"] == "replace" and index < len(target)
                target[index] = op["value"]
        else:
            assert op["op"] == "add" or last in target, f"{op['path']}: nothing to replace"
            target[last] = op["value"]
    return doc


def pool_daemonset() -> Doc:
    """The example pool's DaemonSet as kustomize renders it (the parts of kustomize it uses)."""
    overlay = kustomization(POOL)
    (base,) = [doc for _, doc in resources(POOL) if doc["kind"] == "DaemonSet"]
    for patch in overlay["patches"]:
        target = patch["target"]
        assert (target["kind"], target["name"]) == (base["kind"], base["metadata"]["name"])
        base = json_patch(base, yaml.safe_load(patch["patch"]))
    base["metadata"]["name"] += overlay["nameSuffix"]
    for labels in overlay["labels"]:
        assert labels["includeSelectors"] and labels["includeTemplates"]
        base["metadata"].setdefault("labels", {}).update(labels["pairs"])
        base["spec"]["selector"]["matchLabels"].update(labels["pairs"])
        base["spec"]["template"]["metadata"]["labels"].update(labels["pairs"])
    return base


def node_affinity(workload: Doc) -> list[Doc]:
    terms = workload["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [expr for term in terms for expr in term["matchExpressions"]]


def container(workload: Doc) -> Doc:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def volumes(workload: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def mounted(workload: Doc) -> dict[str, Doc]:
    """mountPath -> the volume mounted there."""
    vols = volumes(workload)
    return {m["mountPath"]: vols[m["name"]] for m in container(workload)["volumeMounts"]}


def command_line(c: Doc) -> list[str]:
    """The container's args with $(VAR) expanded the way the kubelet does, from its own env;
    a reference to an undeclared variable would reach the program literally: a failure here."""
    env = {e["name"]: f"<{e['name']}>" for e in c.get("env", [])}
    sample = {"<NODE_IP>": "10.0.0.7", "<NODE_NAME>": "node-a"}

    def expand(arg: str) -> str:
        def one(m: re.Match[str]) -> str:
            assert m.group(1) in env, f"{arg!r} refers to ${m.group(1)}, which the container does not declare"
            return sample.get(env[m.group(1)], "x")
        return re.sub(r"\$\((\w+)\)", one, arg)

    return [expand(a) for a in c["args"]]


def test_the_kustomization_gathers_every_manifest_once() -> None:
    gathered = [path for path, _ in resources()]
    on_disk = {p.resolve() for p in K8S.rglob("*.yaml")
               if p.name != "kustomization.yaml" and "pools" not in p.relative_to(K8S).parts}
    assert set(gathered) == on_disk and len(set(gathered)) == len(gathered)
    namespace = kustomization()["namespace"]
    for _, doc in resources():
        assert doc["metadata"].get("namespace", namespace) == namespace
        if doc["kind"] in ("Deployment", "DaemonSet"):
            assert container(doc)["image"] in images()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_api_schema(version: str) -> None:
    for path, doc in [*resources(), *((POOL, pool_daemonset()),)]:
        name = path.relative_to(K8S)
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']} at "
                        f"{'.'.join(map(str, exc.path))}: {exc.message} (Kubernetes {version})")


def test_no_secret_value_is_in_the_manifests() -> None:
    kinds = {doc["kind"] for _, doc in resources()}
    assert "Secret" not in kinds, "Secrets are made by the operator (deploy/README.md), not shipped"
    for _, doc in resources():
        if doc["kind"] not in ("Deployment", "DaemonSet"):
            continue
        for e in container(doc).get("env", []):
            assert "value" not in e, f"{e['name']}: a literal value; take it from a Secret or fieldRef"
        assert doc["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[set[str], TestClient]]:
    """The GET routes of the real app, and an anonymous client of it."""
    db = tmp_path_factory.mktemp("k8s") / "stortune.db"
    app = create_app(Settings(db_url=f"sqlite:///{db}"))
    yield {path for method, path, _ in api_routes(app) if method == "GET"}, TestClient(app)
    app.state.engine.dispose()


def test_the_server_runs_replicated_with_probes_it_serves(served: tuple[set[str], TestClient]) -> None:
    deployment, service = the("Deployment"), the("Service")
    assert deployment["spec"]["replicas"] > 1
    c = container(deployment)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    paths, anonymous = served
    probes = {kind: c[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    for kind, probe in probes.items():
        assert probe["path"] in paths, f"{kind}: the server does not serve {probe['path']}"
        assert anonymous.get(probe["path"]).status_code == 200, f"{kind} needs no token"
        assert probe["port"] in ports
    # Readiness asks the database; liveness does not (routes/health.py says why).
    assert probes["readinessProbe"]["path"] == "/healthz"
    assert probes["livenessProbe"]["path"] == "/livez"

    args = parse_command("stortune-server", command_line(c))
    assert args.listen.rpartition(":")[2] == str(ports["http"])
    (svc_port,) = service["spec"]["ports"]
    assert svc_port["targetPort"] == "http"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert args.db is None, "the database URL carries a password: not on the command line"
    (db,) = [e for e in c["env"] if e["name"] == DB_ENV]
    assert set(db["valueFrom"]) == {"secretKeyRef"}
    mounts = mounted(deployment)
    assert "secret" in mounts[str(args.pki_dir)], "every replica signs with the one CA, from a Secret"
    assert str(args.state_dir) in mounts and "/tmp" in mounts
    assert "limits" in c["resources"] and "requests" in c["resources"]


def test_the_server_runs_unprivileged() -> None:
    deployment = the("Deployment")
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0
    c = container(deployment)["securityContext"]
    assert c["readOnlyRootFilesystem"] is True and c["allowPrivilegeEscalation"] is False
    assert c["capabilities"]["drop"] == ["ALL"]


def test_the_agent_runs_on_every_node_and_sees_the_host() -> None:
    daemonset, service = the("DaemonSet"), the("Service")
    pod = daemonset["spec"]["template"]["spec"]
    c = container(daemonset)
    assert c["securityContext"]["privileged"] is True
    assert pod["tolerations"] == [{"operator": "Exists"}], "every node, whatever its taints"
    # uevents come on a netlink socket of the host's network namespace.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"

    argv = command_line(c)
    assert argv[0] == "serve"
    args = parse_command("stortune-agent", argv)
    mounts = mounted(daemonset)

    def host_path(path: str) -> str:
        assert path in mounts, f"{path} is not mounted"
        return str(mounts[path]["hostPath"]["path"])

    assert host_path(args.sysfs) == "/sys" and host_path(args.procfs) == "/proc"
    assert host_path("/dev") == "/dev" and host_path("/run/udev") == "/run/udev"
    assert host_path(args.state_dir) == "/var/lib/stortune", "the journal and originals outlive the pod"
    assert "secret" in mounts[str(Path(args.token_file).parent)]

    env = {e["name"]: e["valueFrom"] for e in c["env"]}
    name_var = re.fullmatch(r"\$\((\w+)\)", c["args"][c["args"].index("--name") + 1])
    assert name_var and env[name_var.group(1)] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert args.label == [], "node labels are per node pool (deploy/README.md), not in the base"

    # The control plane's Service, on its port, in cluster DNS.
    url = urlsplit(args.server)
    namespace = kustomization()["namespace"]
    assert url.hostname == f"{service['metadata']['name']}.{namespace}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert not args.insecure and args.listen.endswith(":50051")


def test_a_node_runs_one_agent_its_pool_labelled() -> None:
    """Nodes without a pool get the base agent, unlabelled; a pool's nodes get the pool's,
    with the pool's labels, and its pods are not the base DaemonSet's (selectors apart)."""
    base, pool = the("DaemonSet"), pool_daemonset()
    assert node_affinity(base) == [{"key": POOL_KEY, "operator": "DoesNotExist"}]
    assert node_affinity(pool) == [{"key": POOL_KEY, "operator": "In", "values": ["streamers"]}]
    assert pool["metadata"]["name"] != base["metadata"]["name"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert (selector[POOL_KEY], base["spec"]["selector"]["matchLabels"][POOL_KEY]) == ("streamers", "default")
    assert selector.items() <= pool["spec"]["template"]["metadata"]["labels"].items()
    args = parse_command("stortune-agent", command_line(container(pool)))
    assert args.label == [("role", "streamer")]
    assert args.name == "node-a" and args.state_dir == "/var/lib/stortune"
