"""Deployment files: they parse, validate, and run the same commands and options the tests run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tandem_client.discovery import parse_node_spec

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


K8S = DEPLOY / "k8s"
LLM_D = K8S / "llm-d"
K8S_DEPLOYMENTS = [pytest.param(K8S, id="front-door"), pytest.param(LLM_D, id="llm-d")]


def kustomize_build(folder: Path) -> list[dict]:
    """What ``kubectl kustomize FOLDER`` makes of our kustomizations: resources (files, or folders
    with their own kustomization) and JSON 6902 patches aimed by kind and name. A kustomization
    field this does not build fails here, so the tests never check less than what is applied
    (``test_kustomize_builds_what_the_tests_check`` compares it with kubectl's own build)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(spec) - {"apiVersion", "kind", "resources", "patches"}
    assert not unknown, f"{folder}: kustomization fields the tests do not build: {unknown}"
    docs: list[dict] = []
    for entry in spec.get("resources", []):
        path = folder / entry
        if path.is_dir():
            docs.extend(kustomize_build(path))
        else:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for patch in spec.get("patches", []):
        doc = the(docs, patch["target"]["kind"], patch["target"]["name"])
        for op in yaml.safe_load((folder / patch["path"]).read_text()):
            _apply_json_patch(doc, op)
    return docs


def _apply_json_patch(doc: dict, op: dict) -> None:
    *parents, last = op["path"].lstrip("/").split("/")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if op["op"] == "add" and last == "-" and isinstance(node, list):
        node.append(op["value"])
    elif op["op"] in ("add", "replace") and isinstance(node, dict):
        assert op["op"] == "add" or last in node, op
        node[last] = op["value"]
    else:
        raise AssertionError(f"a JSON patch the tests do not apply: {op}")


def the(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def k8s_docs() -> list[dict]:
    return kustomize_build(K8S)


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Every workload's pod template, by workload name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def container_ports(template: dict) -> dict[str, int]:
    (container,) = template["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def llm_d_docs() -> list[dict]:
    return kustomize_build(LLM_D)


def flag(args: list[str], name: str) -> str:
    """The value of ``--name=value`` in a container's args (given once)."""
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def kv_events_config(docs: list[dict]) -> dict:
    """generate's --kv-events-config (vLLM's KVEventsConfig as JSON)."""
    (container,) = pod_templates(docs)["tandem-generate"]["spec"]["containers"]
    return dict(json.loads(flag(container["args"], "--kv-events-config")))


def epp_config(docs: list[dict]) -> dict:
    """The EPP's EndpointPickerConfig: the file its --config-file names, from the ConfigMap
    mounted there."""
    pod = pod_templates(docs)["tandem-epp"]["spec"]
    (container,) = pod["containers"]
    path = PurePosixPath(flag(container["args"], "--config-file"))
    (mount,) = [
        m for m in container["volumeMounts"] if path.parent == PurePosixPath(m["mountPath"])
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    config_map = the(docs, "ConfigMap", volume["configMap"]["name"])
    return dict(yaml.safe_load(config_map["data"][path.name]))


def epp_plugin(config: dict, type_: str) -> dict:
    """A plugin's parameters by its type (each type is declared once here)."""
    (plugin,) = [p for p in config["plugins"] if p["type"] == type_]
    return dict(plugin.get("parameters", {}))


def selected(docs: list[dict], selector: dict[str, str]) -> set[str]:
    """The workloads whose pods a label selector (matchLabels) matches."""
    return {
        name
        for name, template in pod_templates(docs).items()
        if selector.items() <= template["metadata"]["labels"].items()
    }


def _defaults(arg: str) -> str:
    """${VAR:-default} -> default, $(VAR) -> a placeholder: what the shell/kubelet would pass."""
    arg = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", arg)
    return re.sub(r"\$\(\w+\)", "some/model", arg)


def render_settings(args: list[str]):
    from tandem_render.__main__ import parse_args

    return parse_args([_defaults(a) for a in args])


def front_settings(args: list[str]):
    from tandem_front.__main__ import parse_args

    return parse_args([_defaults(a) for a in args])


def test_compose_services_and_profiles():
    services = compose()["services"]
    names = {"render", "generate", "render-cpu", "generate-cpu", "tiny-model", "front", "front-cpu"}
    assert names <= set(services)
    assert services["render"]["profiles"] == ["gpu"] and services["generate-cpu"]["profiles"] == [
        "cpu"
    ]
    assert services["render"]["deploy"]["replicas"] == "${RENDER_REPLICAS:-2}"
    gpu = services["generate"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    for name in ("render", "generate", "render-cpu", "generate-cpu", "front", "front-cpu"):
        svc = services[name]
        assert "/health" in " ".join(svc["healthcheck"]["test"]), name
        assert svc["restart"] == "unless-stopped", name
        assert "TANDEM_API_KEY" in svc["environment"], name
        if name.startswith(("generate", "front")):
            assert "TANDEM_ADMIN_API_KEY" in svc["environment"], name


def test_compose_render_commands_are_accepted_by_the_cli():
    services = compose()["services"]
    for name in ("render", "render-cpu"):
        settings = render_settings(services[name]["command"])
        assert settings.host == "0.0.0.0" and settings.port == 8100


def test_the_front_door_is_the_one_url_over_both_tiers():
    services = compose()["services"]
    for name, tier in (("front", ""), ("front-cpu", "-cpu")):
        svc = services[name]
        assert svc["entrypoint"] == ["python", "-m", "tandem_front"]
        settings = front_settings(svc["command"])
        assert settings.port == 8000 and settings.host == "0.0.0.0"
        # Every replica of each tier, by its service name (compose's DNS answers them all).
        assert settings.render_urls == (f"dns+http://render{tier}:8100",)
        assert settings.generate_urls == (f"dns+http://generate{tier}:8200",)
        assert set(svc["depends_on"]) == {f"render{tier}", f"generate{tier}"}
        assert "TANDEM_UPSTREAM_API_KEY" in svc["environment"]
        # Control through the door: its callers' admin key, and the one it sends the nodes.
        assert {"TANDEM_ADMIN_API_KEY", "TANDEM_UPSTREAM_ADMIN_API_KEY"} <= set(svc["environment"])
    (front,) = [
        d
        for d in k8s_docs()
        if d["metadata"]["name"] == "tandem-front" and d["kind"] == "Deployment"
    ]
    (container,) = front["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "tandem_front"]
    settings = front_settings(container["args"])
    env = {e["name"] for e in container["env"]}
    assert {
        "TANDEM_API_KEY",
        "TANDEM_UPSTREAM_API_KEY",
        "TANDEM_ADMIN_API_KEY",
        "TANDEM_UPSTREAM_ADMIN_API_KEY",
    } <= env
    # Each tier is found through a headless Service over its pods: scaling needs no edit.
    for (spec,), workload in (
        (settings.render_urls, "tandem-render"),
        (settings.generate_urls, "tandem-generate"),
    ):
        node = parse_node_spec(spec)
        assert node.name is not None, spec
        docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_docs()}
        svc = docs["Service", node.name]
        assert svc["spec"]["clusterIP"] == "None", "a ClusterIP resolves to one address"
        (pods,) = [
            d
            for (kind, name), d in docs.items()
            if name == workload and kind in ("Deployment", "StatefulSet")
        ]
        labels = pods["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        (port,) = svc["spec"]["ports"]
        (served,) = pods["spec"]["template"]["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in served["ports"]}
        assert port["port"] == node.port == named[port["targetPort"]], spec


@pytest.mark.vllm
def test_compose_and_k8s_generate_args_are_accepted_by_the_cli(qwen2_dir):
    from tandem_generate.__main__ import parse_args

    def local(args: list[str]) -> list[str]:
        # The hub model of the GPU profile is swapped for the local tiny one (no hub here).
        return [f"--model={qwen2_dir}" if a.startswith("--model") else _defaults(a) for a in args]

    services = compose()["services"]
    for name in ("generate", "generate-cpu"):
        settings, engine = parse_args(local(services[name]["command"]))
        assert settings.port == 8200 and engine.model == qwen2_dir
    for docs in (k8s_docs(), llm_d_docs()):
        (container,) = pod_templates(docs)["tandem-generate"]["spec"]["containers"]
        settings, engine = parse_args(local(container["args"]))
        assert settings.host == "0.0.0.0"
    # With llm-d the engine publishes its KV events where, and in blocks as, the EPP expects.
    events = engine.kv_events_config
    assert events.enable_kv_cache_events and events.publisher == "zmq"
    assert events.endpoint == kv_events_config(docs)["endpoint"]
    precise = epp_plugin(epp_config(docs), "precise-prefix-cache-producer")
    assert engine.block_size == precise["tokenProcessorConfig"]["blockSizeTokens"]
    # Keys a scheduler can compute: CBOR, not pickle (tests/integration/test_kv_events.py).
    assert engine.prefix_caching_hash_algo == "sha256_cbor"


@pytest.mark.skipif(
    not (shutil.which("docker-compose") or shutil.which("docker")), reason="no compose client"
)
def test_compose_config_validates_with_the_docker_client():
    cmd = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
    probe = subprocess.run([*cmd, "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("docker client without the compose plugin")
    for profile in ("gpu", "cpu"):
        done = subprocess.run(
            [*cmd, "-f", str(DEPLOY / "compose.yaml"), "--profile", profile, "config", "-q"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr


def test_k8s_manifests():
    docs = k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Deployment", "tandem-render"),
        ("Service", "tandem-render"),
        ("HorizontalPodAutoscaler", "tandem-render"),
        ("StatefulSet", "tandem-generate"),
        ("Service", "tandem-generate"),
        ("ConfigMap", "tandem-config"),
        ("Deployment", "tandem-front"),
        ("Service", "tandem-front"),
    } <= kinds
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        (container,) = d["spec"]["template"]["spec"]["containers"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/health"
        secret = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}["TANDEM_API_KEY"]
        assert secret["secretKeyRef"]["name"] == "tandem-api-key"
        if d["metadata"]["name"] != "tandem-render":
            admin = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
            ref = admin["TANDEM_ADMIN_API_KEY"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("tandem-admin-api-key", "admin-api-key")
        assert (
            d["spec"]["selector"]["matchLabels"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        )
    (deploy,) = [
        d for d in docs if d["metadata"]["name"] == "tandem-render" and d["kind"] == "Deployment"
    ]
    render_settings(deploy["spec"]["template"]["spec"]["containers"][0]["args"])
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    gpu = sts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpu == "1"
    (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tandem-render",
    }


def test_llm_d_pool_selects_the_generate_pods_only():
    docs = llm_d_docs()
    pool = the(docs, "InferencePool", "tandem-generate")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    matching = pool["spec"]["selector"]["matchLabels"]
    # Model servers only: not render, not the EPP, nor the door applied next to it.
    assert selected(docs, matching) == {"tandem-generate"}
    assert not selected([the(k8s_docs(), "Deployment", "tandem-front")], matching)
    (port,) = pool["spec"]["targetPorts"]
    assert port["number"] == container_ports(pod_templates(docs)["tandem-generate"])["http"]
    (rule,) = the(docs, "HTTPRoute", "tandem-generate")["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )
    # vLLM's generate route (tandem_generate.schemas.GENERATE_PATH; importing it loads vLLM).
    assert [m["path"]["value"] for m in rule["matches"]] == ["/inference/v1/generate"]


def test_llm_d_pool_reaches_its_endpoint_picker():
    docs = llm_d_docs()
    pool = the(docs, "InferencePool", "tandem-generate")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service"
    assert ref["failureMode"] in ("FailOpen", "FailClose")
    service = the(docs, "Service", ref["name"])
    assert selected(docs, service["spec"]["selector"]) == {"tandem-epp"}
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    epp = pod_templates(docs)["tandem-epp"]
    assert container_ports(epp)[port["targetPort"]] == 9002, "the EPP's ext-proc port"
    (container,) = epp["spec"]["containers"]
    args = container["args"]
    assert flag(args, "--pool-name") == pool["metadata"]["name"]
    assert flag(args, "--pool-group") == "inference.networking.k8s.io"
    health = int(flag(args, "--grpc-health-port"))
    assert container_ports(epp)["grpc-health"] == health
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == health, probe
    # It watches the pool and its pods under its own account.
    account = epp["spec"]["serviceAccountName"]
    assert the(docs, "ServiceAccount", account)
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account} in d["subjects"]
    ]
    role = the(docs, "Role", binding["roleRef"]["name"])
    granted = {
        (group, resource)
        for rule in role["rules"]
        if {"get", "list", "watch"} <= set(rule["verbs"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted


def test_llm_d_token_producer_calls_the_render_service():
    docs = llm_d_docs()
    producer = epp_plugin(epp_config(docs), "token-producer")
    url = urlsplit(producer["vllm"]["url"])
    assert url.scheme == "http" and url.path in ("", "/")
    service = the(docs, "Service", url.hostname)
    assert selected(docs, service["spec"]["selector"]) == {"tandem-render"}
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    render = pod_templates(docs)["tandem-render"]
    (container,) = render["spec"]["containers"]
    assert container_ports(render)[port["targetPort"]] == render_settings(container["args"]).port
    # Render answers for the model it serves; the EPP names it in its requests and probes.
    model = the(docs, "ConfigMap", "tandem-config")["data"]["model"]
    assert producer["modelName"] == model
    # The EPP's start-up probe of render carries the inference key render checks.
    (epp,) = pod_templates(docs)["tandem-epp"]["spec"]["containers"]
    keys = {e["name"]: e.get("valueFrom") for e in (*epp["env"], *container["env"])}
    assert keys["VLLM_API_KEY"] == keys["TANDEM_API_KEY"]


def test_llm_d_prefix_cache_follows_the_events_generate_publishes():
    docs = llm_d_docs()
    config = epp_config(docs)
    events = kv_events_config(docs)
    precise = epp_plugin(config, "precise-prefix-cache-producer")
    kv = precise["kvEventsConfig"]
    generate = pod_templates(docs)["tandem-generate"]
    (container,) = generate["spec"]["containers"]
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    # Each pod binds its own socket; the EPP dials every pool pod on that port.
    endpoint = urlsplit(events["endpoint"])
    assert endpoint.scheme == "tcp" and endpoint.hostname == "*"
    assert kv["discoverPods"] is True
    assert kv["podDiscoveryConfig"]["socketPort"] == endpoint.port
    assert container_ports(generate)["kv-events"] == endpoint.port
    # The topic names the pod by the address the pool routes to, and the model requests name.
    pool = the(docs, "InferencePool", "tandem-generate")
    (target,) = pool["spec"]["targetPorts"]
    assert events["topic"] == f"kv@$(POD_IP):{target['number']}@$(MODEL)"
    assert events["topic"].startswith(kv["topicFilter"])
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["MODEL"] == {"configMapKeyRef": {"name": "tandem-config", "key": "model"}}
    matching = pool["spec"]["selector"]["matchLabels"]
    labels = ",".join(f"{k}={v}" for k, v in matching.items())
    assert kv["podDiscoveryConfig"]["podLabelSelector"] == labels
    # Block keys cut where vLLM cuts its blocks.
    block = int(flag(container["args"], "--block-size"))
    assert precise["tokenProcessorConfig"]["blockSizeTokens"] == block
    # The scorer reads this producer's matches, and every reference names a declared plugin.
    names = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    scorer = epp_plugin(config, "prefix-cache-scorer")
    assert names[scorer["prefixMatchInfoProducerName"]] == "precise-prefix-cache-producer"
    (profile,) = config["schedulingProfiles"]
    used = [p["pluginRef"] for p in profile["plugins"]]
    assert "prefix-cache-scorer" in used
    for source in config["dataLayer"]["sources"]:
        used += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    assert set(used) <= set(names)


def test_llm_d_render_scales_on_cpu_and_its_latency():
    from prometheus_client import CollectorRegistry

    from tandem_render.metrics import RenderMetrics

    hpa = the(llm_d_docs(), "HorizontalPodAutoscaler", "tandem-render")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tandem-render",
    }
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    latency = metrics["Pods"]["pods"]["metric"]["name"]
    # The adapter rule on the page makes that metric from render's own latency histogram.
    histogram = RenderMetrics.create(CollectorRegistry()).latency._name
    page = (ROOT / "docs" / "deployment" / "llm-d.md").read_text()
    # The page fences the rule as text (docs fences are python, json, sh, text or console).
    found = re.findall(r"```text\n(rules:\n.*?)```", page, re.S)
    (rule,) = [r for b in found for r in yaml.safe_load(b)["rules"]]
    assert rule["seriesQuery"].startswith(f"{histogram}_bucket{{")
    assert re.fullmatch(rule["name"]["matches"], f"{histogram}_bucket")
    assert rule["name"]["as"] == latency
    assert "histogram_quantile" in rule["metricsQuery"]


def test_dockerfiles_run_the_tested_commands():
    render = (DEPLOY / "render.Dockerfile").read_text()
    generate = (DEPLOY / "generate.Dockerfile").read_text()
    assert 'ENTRYPOINT ["python", "-m", "tandem_render"]' in render
    assert "tools/setup_env.py --venv /opt/venv --production" in render  # the tests' set-up
    assert 'ENTRYPOINT ["python3", "-m", "tandem_generate"]' in generate
    assert "vllm/vllm-openai:v0.32.0" in generate  # the release render pins
    from tools.setup_env import VLLM_VERSION

    assert VLLM_VERSION == "0.32.0"


HADOLINT = shutil.which("hadolint") or shutil.which(
    "hadolint", path=str(Path(sys.executable).parent)
)


KUBERNETES_VALIDATE = shutil.which("kubernetes-validate") or shutil.which(
    "kubernetes-validate", path=str(Path(sys.executable).parent)
)


CUSTOM_KINDS = {"InferencePool", "HTTPRoute"}
"""Kinds from CRDs (Inference Extension, Gateway API): kubernetes-validate has no schema for them,
so ``test_llm_d_*`` check their fields."""


@pytest.mark.skipif(KUBERNETES_VALIDATE is None, reason="kubernetes-validate is not installed")
@pytest.mark.parametrize("folder", K8S_DEPLOYMENTS)
def test_k8s_manifests_validate_strictly(folder, tmp_path):
    built = tmp_path / "built.yaml"
    built.write_text(
        yaml.safe_dump_all([d for d in kustomize_build(folder) if d["kind"] not in CUSTOM_KINDS])
    )
    done = subprocess.run(
        [KUBERNETES_VALIDATE, "--strict", str(built)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("folder", K8S_DEPLOYMENTS)
def test_kustomize_builds_what_the_tests_check(folder):
    done = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    def key(d: dict) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    built = sorted(yaml.safe_load_all(done.stdout), key=key)
    assert built == sorted(kustomize_build(folder), key=key)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed")
@pytest.mark.parametrize("name", ["render.Dockerfile", "generate.Dockerfile"])
def test_dockerfiles_lint(name):
    # DL3008: apt versions float with the base image's Debian release on purpose.
    done = subprocess.run(
        [HADOLINT, "--ignore", "DL3008", str(DEPLOY / name)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
