"""The KubeRay provider: every manifest it makes validates strictly against KubeRay v1.7.0's
own CRDs, the same check names the path of any unknown or mistyped field, secrets reach the
manifest only as Secret references, hostile strings stay one argv word each through the
shells KubeRay and Ray put the entrypoint through, and a run applies, follows and maps the
RayJob's end states to the documented outcomes.

No Kubernetes cluster is available offline. Applying and following are tested with a fake
``kubectl`` on PATH (tests/fake_kubectl.py) that stands in for the API server and the KubeRay
operator: it records its argv, answers ``get rayjob`` with canned RayJob status JSON, and on
``apply`` can run the job's entrypoint as KubeRay's K8sJobMode submitter and ``ray job submit``
would (bash parses it, Ray re-joins the words with shlex.join, sh runs them).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

yaml = pytest.importorskip("yaml", reason="the kuberay extra: pip install "
                                          "'stateset-backend[kuberay]'")
pytest.importorskip("openapi_schema_validator", reason="the kuberay extra: pip install "
                                                       "'stateset-backend[kuberay]'")

from stateset_backend.common.errors import (  # noqa: E402
    EngineFailed,
    InvalidInput,
    NotExecuted,
    StatesetError,
    Unsupported,
)
from stateset_backend.engines.registry import build_registry  # noqa: E402
from stateset_backend.plan.kuberay import RAYJOB_FILE, attempt_launch, settings_from  # noqa: E402
from stateset_backend.plan.launch_plan import load_plan, make_plan, write_plan  # noqa: E402
from stateset_backend.providers.kuberay import crd, job  # noqa: E402
from stateset_backend.providers.kuberay.job import RayJobState, to_exit  # noqa: E402
from stateset_backend.providers.kuberay.manifest import label_value, rayjob_name  # noqa: E402
from stateset_backend.providers.kuberay.settings import KubeRaySettings  # noqa: E402
from stateset_backend.runs.runner import raise_for_status, run_plan  # noqa: E402
from stateset_backend.runs.store import RunStore  # noqa: E402
from stateset_backend.spec.content import sha256_file  # noqa: E402
from stateset_backend.spec.files import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
ENGINES = {"native": "0.1.0", "verl": "0.9.1", "openrlhf": "0.11.2", "nemo-rl": "0.7.0"}
POD_ROOT = "/mnt/stateset"
SENTINEL = "sentinel-secret-3f9a7c1e"
HOSTILE = "it's \"$(touch pwned)\" `id` $HOME;\nrm -rf ~ # ünï"


@pytest.fixture(scope="module")
def crds() -> Path:
    folder = crd.crd_folder()
    if folder is None:
        pytest.skip(crd.missing_crds_reason())
    return folder


@pytest.fixture(scope="module")
def registry():
    return build_registry()


def repo_settings(**changes: Any) -> dict[str, Any]:
    """The repository as the shared volume: this machine sees it here, the pods at POD_ROOT."""
    doc: dict[str, Any] = {
        "image": "rayproject/ray:2.49.0-py311-gpu", "ray_version": "2.49.0",
        "engine_home": "/opt/nemo-rl",
        "volume": {"claim_name": "team-pvc", "mount_path": POD_ROOT, "local_path": str(REPO)},
        "secrets": {"WANDB_API_KEY": {"name": "wandb", "key": "api-key"}}}
    doc.update(changes)
    return doc


def _plan(registry, spec_path: Path, engine: str, settings: dict[str, Any], **kw: Any):
    return make_plan(load_spec(spec_path), registry.get(engine), kw.pop("version", None) or
                     ENGINES[engine], provider=kw.pop("provider", "kuberay"),
                     base_dir=spec_path.parent, provider_settings=settings, **kw)


def _manifest(plan) -> dict[str, Any]:
    return yaml.safe_load(plan.files[RAYJOB_FILE])


@pytest.fixture
def hub_cache_on_volume(monkeypatch):
    """Pinned hub commits load from the cache's snapshot: a cache on the volume."""
    monkeypatch.setenv("HF_HUB_CACHE", str(REPO / ".hf-cache"))


def _example_specs() -> list[Path]:
    return sorted([*EXAMPLES.glob("*.json"), *(EXAMPLES / "external").glob("*.json"),
                   *(EXAMPLES / "recipes").glob("*.json")])


def test_every_example_manifest_validates_strictly_against_the_crds(crds, registry,
                                                                    hub_cache_on_volume):
    """Each example spec on each engine whose local plan succeeds: its kuberay plan succeeds
    too, its manifest passes the CRDs' schemas, the strict unknown-field walk and the
    operator's rules, its entrypoint reads back as the pods' argv, and nothing of this
    machine's view of the volume reaches the pods."""
    validated: dict[str, int] = {}
    for spec_path in _example_specs():
        for engine in ENGINES:
            try:
                _plan(registry, spec_path, engine, {}, provider="local")
            except StatesetError:
                continue  # the engine cannot run this spec anywhere
            plan = _plan(registry, spec_path, engine, repo_settings())
            manifest = _manifest(plan)
            assert crd.problems(manifest, crds) == [], (spec_path.name, engine)
            layout = registry.get(engine).adapter.cluster_launch
            argv = attempt_launch(plan, settings_from(plan.provider_settings), 1, layout).argv
            assert shlex.split(manifest["spec"]["entrypoint"]) == argv
            cluster_side = json.dumps([manifest, plan.argv, plan.set_env, plan.files,
                                       plan.native])
            assert str(REPO) not in cluster_side, (spec_path.name, engine)
            validated[engine] = validated.get(engine, 0) + 1
    assert set(validated) == set(ENGINES) and sum(validated.values()) >= 25, validated


def test_the_plan_records_settings_and_manifest_under_its_checksum(registry, tmp_path,
                                                                   hub_cache_on_volume):
    plan = _plan(registry, EXAMPLES / "external" / "grpo.json", "verl", repo_settings())
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert load_plan(path).provider_settings["volume"]["claim_name"] == "team-pvc"
    doc = json.loads(path.read_text())
    doc["files"][RAYJOB_FILE] = doc["files"][RAYJOB_FILE].replace("team-pvc", "other-pvc")
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput, match="checksum mismatch"):
        load_plan(path)
    manifest = _manifest(plan)
    assert manifest["metadata"]["name"] == rayjob_name(plan.run_id, 1)
    workers = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 1  # resources.nodes
    assert workers["template"]["spec"]["containers"][0]["resources"]["limits"][
        "nvidia.com/gpu"] == "8"  # resources.gpus_per_node
    labels = manifest["metadata"]["labels"]
    assert labels["stateset.dev/experiment"] == plan.experiment_digest[7:39]
    assert all(len(v) <= 63 for v in labels.values())


def _verl_manifest(registry) -> dict[str, Any]:
    return _manifest(_plan(registry, EXAMPLES / "external" / "grpo.json", "verl",
                           repo_settings()))


def _worker(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]


def _set(path: str, value: Any):
    def edit(m: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = m
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return edit


MUTATIONS = {
    "unknown top-level spec field": (
        _set("spec.shutdownAfterJobFinish", True), "spec.shutdownAfterJobFinish: unknown field"),
    "unknown field deep in a pod template": (
        _set("spec.rayClusterSpec.headGroupSpec.template.spec.containers.0.imagePullPolicyy",
             "Always"),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].imagePullPolicyy: "
        "unknown field"),
    "string ttl": (_set("spec.ttlSecondsAfterFinished", "600"),
                   "spec.ttlSecondsAfterFinished: '600' is not of type 'integer'"),
    "int32 overflow": (_set("spec.ttlSecondsAfterFinished", 2**40),
                       "spec.ttlSecondsAfterFinished: 1099511627776 is not a 'int32'"),
    "int rayStartParams value": (
        _set("spec.rayClusterSpec.workerGroupSpecs.0.rayStartParams.num-gpus", 8),
        "spec.rayClusterSpec.workerGroupSpecs[0].rayStartParams.num-gpus: 8 is not of type "
        "'string'"),
    "missing maxReplicas": (
        lambda m: _worker(m).pop("maxReplicas"),
        "spec.rayClusterSpec.workerGroupSpecs[0]: 'maxReplicas' is a required property"),
    "bad submissionMode": (_set("spec.submissionMode", "K8sJob"),
                           "spec.submissionMode: 'K8sJob' is not one of K8sJobMode"),
    "name KubeRay refuses": (_set("metadata.name", "Stateset_" + "x" * 50), "metadata.name"),
    "token auth on a Ray without it": (  # the manifest's rayVersion is 2.49.0
        _set("spec.rayClusterSpec.authOptions", {"mode": "token"}),
        "spec.rayClusterSpec.authOptions.mode: token needs Ray 2.52.0 or later"),
    "Kubernetes token auth": (
        _set("spec.rayClusterSpec.authOptions", {"mode": "token", "enableK8sTokenAuth": True}),
        "spec.rayClusterSpec.authOptions.enableK8sTokenAuth"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_bad_field_is_rejected_naming_its_path(case, crds, registry, hub_cache_on_volume):
    manifest = copy.deepcopy(_verl_manifest(registry))
    assert crd.problems(manifest, crds) == []
    edit, expected = MUTATIONS[case]
    edit(manifest)
    with pytest.raises(InvalidInput) as raised:
        crd.validate(manifest, crds)
    assert expected in raised.value.message, raised.value.message


def test_a_crd_folder_without_the_crds_is_refused_with_where_to_put_them(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv(crd.CRD_ENV, str(tmp_path))
    with pytest.raises(InvalidInput, match=r"ray\.io_rayjobs\.yaml"):
        crd.crd_folder()


@pytest.mark.parametrize("field, value", [
    ("image", "Ray:latest"), ("image", "ray; rm -rf /"), ("image", "ray:2.9\nx"),
    ("namespace", "Team_A"), ("namespace", "a" * 64), ("service_account", "sa$(id)"),
    ("head", {"cpu": "8 cores", "memory": "16Gi"}), ("head", {"cpu": "8", "memory": "-1Gi"}),
    ("worker", {"cpu": "8", "memory": "64Gi", "gpus": -1}),
    ("submission_mode", "InteractiveMode"), ("ttl_seconds_after_finished", 2**31),
    ("active_deadline_seconds", 0), ("python", "python; id"), ("engine_home", "/opt/../etc"),
    ("volume", {"claim_name": "pvc", "mount_path": "relative"}),
    ("volume", {"claim_name": "pvc", "mount_path": "/mnt/a b"}),
    ("volume", {"claim_name": "pvc", "mount_path": "/mnt", "local_path": "/mnt/x"}),
    ("secrets", {"WANDB-KEY": {"name": "wandb", "key": "k"}}),
    ("secrets", {"HF_TOKEN": {"name": "Bad Name", "key": "k"}}),
    ("unknown_setting", 1),
])
def test_a_setting_kubernetes_would_refuse_is_refused(field, value):
    doc = {"image": "rayproject/ray:2.49.0", "volume": {"claim_name": "pvc",
                                                        "mount_path": "/mnt/s"}, field: value}
    with pytest.raises(ValidationError):
        KubeRaySettings.model_validate(doc)
    with pytest.raises(InvalidInput, match="kuberay settings: "):
        settings_from(doc)


def test_image_references_in_their_usual_forms_are_accepted():
    for image in ("rayproject/ray:2.49.0-py311-gpu", "nvcr.io/nvidia/pytorch:24.01-py3",
                  "registry.local:5000/team/verl@sha256:" + "a" * 64, "ubuntu"):
        assert KubeRaySettings(image=image, volume={"claim_name": "p", "mount_path": "/m"})


def test_label_values_and_names_fit_kubernetes():
    assert label_value("verl") == "verl"
    odd = label_value("my plugin/engine:" + "x" * 80)
    assert len(odd) <= 63 and odd[0].isalnum() and odd[-1].isalnum()
    assert rayjob_name("20261205T000000Z-abcdef01", 3) == "stateset-20261205t000000z-abcdef01-3"
    assert len(rayjob_name("20261205T000000Z-abcdef01", 10**20)) <= 47


def test_secrets_never_reach_the_manifest_plan_or_attempt(registry, tmp_path, monkeypatch,
                                                          hub_cache_on_volume, echo_volume):
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL)
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    plan = _plan(registry, EXAMPLES / "external" / "grpo.json", "verl", repo_settings(
        secrets={"WANDB_API_KEY": {"name": "wandb", "key": "api-key"},
                 "HF_TOKEN": {"name": "hf", "key": "token"}}))
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert SENTINEL not in path.read_text() and SENTINEL not in plan.files[RAYJOB_FILE]
    env = _manifest(plan)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} \
        in env and all("value" not in item for item in env)
    # and the attempt a run prepares from a plan made and run with the secret in the env
    spec, settings, store = echo_volume(secrets={"ECHO_TOKEN": {"name": "echo", "key": "t"}})
    monkeypatch.setenv("ECHO_TOKEN", SENTINEL)
    echo = make_plan(load_spec(spec), registry.get("echo"), "1.2.0", provider="kuberay",
                     base_dir=spec.parent, provider_settings=settings)
    result, _ = run_plan(echo, registry, store, echo_stderr=False)
    assert result.status == "prepared"
    files = [p for p in store.root.rglob("*") if p.is_file() and p.suffix != ".sqlite"]
    assert files and not [p for p in files if SENTINEL.encode() in p.read_bytes()]


def _auth_settings(**auth: Any) -> dict[str, Any]:
    return repo_settings(image="rayproject/ray:2.52.0-py311-gpu", ray_version="2.52.0",
                         auth={"mode": "token", **auth})


@pytest.mark.parametrize("auth, expected", [
    ({"secret_name": "ray-token"}, {"mode": "token", "secretName": "ray-token"}),
    ({}, {"mode": "token"}),  # KubeRay makes a Secret with a random token for the cluster
])
def test_token_auth_is_kuberays_auth_options_naming_only_the_secret(
        auth, expected, crds, registry, tmp_path, monkeypatch, hub_cache_on_volume,
        echo_volume):
    """KubeRay v1.7.0 gives the head, the workers and the K8sJobMode submitter RAY_AUTH_MODE
    and RAY_AUTH_TOKEN (from the Secret's auth_token key) itself: the manifest carries
    authOptions alone, it validates against the CRDs, and the token of whoever plans and runs
    reaches no file."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", SENTINEL)
    plan = _plan(registry, EXAMPLES / "external" / "grpo.json", "verl", _auth_settings(**auth))
    manifest = _manifest(plan)
    assert manifest["spec"]["rayClusterSpec"]["authOptions"] == expected
    assert crd.problems(manifest, crds) == []
    assert "Ray token authentication: KubeRay gives the pods and the submitter RAY_AUTH_TOKEN" \
        in plan.files[RAYJOB_FILE]
    assert plan.provider_settings["auth"] == {"mode": "token", "secret_name": None, **auth}
    pods = [manifest["spec"]["rayClusterSpec"]["headGroupSpec"],
            *manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    assert not [e for p in pods for e in p["template"]["spec"]["containers"][0].get("env", [])
                if e["name"].startswith("RAY_AUTH")]
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert SENTINEL not in path.read_text() and SENTINEL not in plan.files[RAYJOB_FILE]
    # the attempt `run` prepares from it, with the token still in the environment
    spec, settings, store = echo_volume(image="rayproject/ray:2.52.0", ray_version="2.52.0",
                                        auth={"mode": "token", **auth})
    echo = make_plan(load_spec(spec), registry.get("echo"), "1.2.0", provider="kuberay",
                     base_dir=spec.parent, provider_settings=settings)
    result, _ = run_plan(echo, registry, store, echo_stderr=False)
    attempt = store.run_dir(echo.run_id) / "attempts" / "1"
    assert result.status == "prepared"
    assert yaml.safe_load((attempt / RAYJOB_FILE).read_text())["spec"]["rayClusterSpec"][
        "authOptions"] == expected
    files = [p for p in store.root.rglob("*") if p.is_file() and p.suffix != ".sqlite"]
    assert files and not [p for p in files if SENTINEL.encode() in p.read_bytes()]


@pytest.mark.parametrize("changes, expected", [
    ({"ray_version": "2.49.0"}, "token authentication needs Ray 2.52.0 or later; ray_version "
                                "is 2.49.0"),
    ({"ray_version": None}, "token authentication needs ray_version"),
    ({"secrets": {"RAY_AUTH_TOKEN": {"name": "mine", "key": "t"}}},
     "secrets RAY_AUTH_TOKEN: KubeRay sets these itself"),
])
def test_token_auth_kuberay_would_refuse_is_refused_when_planning(changes, expected):
    doc = {**_auth_settings(), **changes}
    with pytest.raises(InvalidInput) as raised:
        settings_from(doc)
    assert raised.value.message.startswith("kuberay settings: auth: ") and \
        expected in raised.value.message, raised.value.message


def test_hostile_strings_stay_one_argv_word_through_every_shell(crds, registry, tmp_path,
                                                                 monkeypatch):
    """A spec folder, spec name and engine option full of quotes, ``$(...)``, backquotes and
    newlines: the entrypoint parses back (shlex, and bash as KubeRay's submitter runs it, then
    sh after Ray's shlex.join) to exactly the launch's argv, and nothing runs."""
    volume = tmp_path / "vol"
    folder = volume / HOSTILE
    (folder / "external").mkdir(parents=True)
    for name in ("data", "support-routing"):
        src = EXAMPLES / ("external/data" if name == "data" else name)
        dest = folder / ("external/data" if name == "data" else name)
        subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
    doc = json.loads((EXAMPLES / "external" / "grpo.json").read_text())
    doc["name"] = HOSTILE
    (folder / "external" / "grpo.json").write_text(json.dumps(doc))
    monkeypatch.setenv("HF_HUB_CACHE", str(volume / "hf"))
    settings = {"image": "rayproject/ray:2.49.0", "volume": {
        "claim_name": "pvc", "mount_path": "/mnt/vol", "local_path": str(volume)}}
    plan = _plan(registry, folder / "external" / "grpo.json", "verl", settings)
    manifest = _manifest(plan)
    assert crd.problems(manifest, crds) == []
    argv = attempt_launch(plan, settings_from(settings), 1, "ray").argv
    assert any("$(touch pwned)" in word for word in argv)  # the folder reached it, as data
    line = manifest["spec"]["entrypoint"]
    assert shlex.split(line) == argv
    words = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + line], capture_output=True,
                           check=True, cwd=tmp_path).stdout.decode().split("\0")[:-1]
    assert words == argv
    again = subprocess.run(["sh", "-c", 'printf "%s\\0" ' + shlex.join(words)],
                           capture_output=True, check=True, cwd=tmp_path).stdout
    assert again.decode().split("\0")[:-1] == argv
    assert not (tmp_path / "pwned").exists() and str(volume) not in json.dumps(manifest)


def test_a_spec_folder_off_the_volume_is_refused(registry, tmp_path, echo_volume):
    spec, settings, _ = echo_volume()
    settings["volume"] = {**settings["volume"], "local_path": str(tmp_path / "elsewhere"),
                          "mount_path": "/mnt/x"}
    with pytest.raises(InvalidInput, match="not on the shared volume"):
        make_plan(load_spec(spec), registry.get("echo"), "1.2.0", provider="kuberay",
                  base_dir=spec.parent, provider_settings=settings)


# -- running: the attempt's manifest, applied or not --------------------------------------
@pytest.fixture
def echo_volume(tmp_path, minimal):
    """An echo-engine spec on a volume this machine sees at the pods' path (so the fake
    kubectl can run the entrypoint here), and the run store on it."""

    def make(behaviour: str = "ok", **settings_changes: Any):
        exp = tmp_path / "vol" / "exp"
        (exp / "data").mkdir(parents=True, exist_ok=True)
        train = exp / "data" / "train.jsonl"
        train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)
        reward = exp / "reward.py"
        reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
        doc = copy.deepcopy(minimal)
        doc["data"]["train"]["sha256"] = sha256_file(train)
        doc["reward"]["sha256"] = sha256_file(reward)
        doc["engine_options"] = {"echo": {"behaviour": behaviour}}
        spec = exp / f"spec-{behaviour}.json"
        spec.write_text(json.dumps(doc))
        settings = {"image": "rayproject/ray:2.49.0", "python": sys.executable,
                    "namespace": "team-a",
                    "volume": {"claim_name": "pvc", "mount_path": str(tmp_path / "vol")},
                    **settings_changes}
        return spec, settings, RunStore(tmp_path / "vol" / "runs")

    return make


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    """The fake kubectl first on PATH; its argv log and state folder."""
    bin_dir, state = tmp_path / "bin", tmp_path / "kubectl-state"
    bin_dir.mkdir()
    state.mkdir()
    exe = bin_dir / "kubectl"
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                   f"{shlex.quote(str(Path(__file__).with_name('fake_kubectl.py')))} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_DIR", str(state))
    monkeypatch.setenv("FAKE_KUBECTL_LOG", str(state / "argv.jsonl"))
    monkeypatch.setattr(job, "POLL_SECONDS", 0.05)

    def calls() -> list[list[str]]:
        log = state / "argv.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] \
            if log.is_file() else []

    def canned(*statuses: dict[str, Any]) -> None:
        path = state / "canned.json"
        path.write_text(json.dumps(list(statuses)))
        monkeypatch.setenv("FAKE_KUBECTL_STATES", str(path))

    return calls, canned


def _echo_plan(registry, echo_volume, behaviour: str = "ok", **changes: Any):
    spec, settings, store = echo_volume(behaviour, **changes)
    plan = make_plan(load_spec(spec), registry.get("echo"), "1.2.0", provider="kuberay",
                     base_dir=spec.parent, provider_settings=settings)
    return plan, store


def test_without_apply_the_manifest_is_written_and_nothing_runs(registry, echo_volume,
                                                                kubectl):
    calls, _ = kubectl
    plan, store = _echo_plan(registry, echo_volume)
    result, path = run_plan(plan, registry, store, echo_stderr=False)
    attempt = store.run_dir(plan.run_id) / "attempts" / "1"
    assert result.status == "prepared" and result.exit_code is None and calls() == []
    written = yaml.safe_load((attempt / RAYJOB_FILE).read_text())
    assert written["metadata"]["name"] == rayjob_name(plan.run_id, 1)
    assert (attempt / "echo.json").is_file() and not (attempt / "identity.json").exists()
    with pytest.raises(NotExecuted) as raised:
        raise_for_status(result, path)
    assert raised.value.exit_code == 7
    assert f"kubectl apply --validate=strict -f {attempt / RAYJOB_FILE}" in raised.value.message
    # a second attempt gets its own name and folder in its manifest
    run_plan(plan, registry, store, echo_stderr=False)
    second = yaml.safe_load((attempt.parent / "2" / RAYJOB_FILE).read_text())
    assert second["metadata"]["name"].endswith("-2")
    assert str(attempt.parent / "2") in second["spec"]["entrypoint"]


def test_apply_runs_the_job_follows_it_and_collects_a_checked_result(registry, echo_volume,
                                                                     kubectl):
    calls, _ = kubectl
    os.environ["FAKE_KUBECTL_RUN"] = "1"
    try:
        plan, store = _echo_plan(registry, echo_volume)
        result, _ = run_plan(plan, registry, store, echo_stderr=False, apply=True)
    finally:
        del os.environ["FAKE_KUBECTL_RUN"]
    assert result.status == "succeeded", result.checks
    attempt = store.run_dir(plan.run_id) / "attempts" / "1"
    name = rayjob_name(plan.run_id, 1)
    verbs = [c[0] for c in calls()]
    assert calls()[0] == ["apply", "--validate=strict", "-f", str(attempt / RAYJOB_FILE)]
    assert ["get", "rayjob", name, "-n", "team-a", "-o", "json"] in calls()
    assert verbs[-1] == "logs" and "echo engine: done" in (attempt / "stdout.log").read_text()
    assert "Complete (job SUCCEEDED)" in (attempt / "stderr.log").read_text()


def test_a_failed_job_is_failed_with_the_engine_exit_code(registry, echo_volume, kubectl):
    _, canned = kubectl
    canned({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
           {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
            "message": "Job entrypoint command failed with exit code 3"})
    plan, store = _echo_plan(registry, echo_volume)
    result, path = run_plan(plan, registry, store, echo_stderr=False, apply=True)
    assert (result.status, result.exit_code) == ("failed", 3)
    with pytest.raises(EngineFailed):
        raise_for_status(result, path)


def test_an_applied_rayjob_is_listed_in_flight_with_its_state_until_it_ends(
        registry, echo_volume, kubectl, monkeypatch):
    """`runs list` reads the index alone: the provider's word that the RayJob was applied puts
    the attempt there, with kubectl's view of it, until its result replaces it."""
    from stateset_backend.providers import base
    from stateset_backend.runs.views import in_flight, record_submitted

    _, canned = kubectl
    canned({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
           {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
           {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    plan, store = _echo_plan(registry, echo_volume)
    seen: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(base, "SUBMITTED", [record_submitted,
                                            lambda *_: seen.append(in_flight(store))])
    run_plan(plan, registry, store, echo_stderr=False, apply=True)
    name = rayjob_name(plan.run_id, 1)
    assert seen == [[{"run_id": plan.run_id, "attempt": 1, "provider": "kuberay",
                      "job": f"team-a/{name}", "state": "running", "job_state": "Running",
                      "reason": "job RUNNING", "run_process": "running"}]]
    assert in_flight(store) == []  # its result is indexed now



def test_a_rayjob_whose_run_was_killed_is_listed_as_kubectl_says_then_abandoned(
        registry, echo_volume, kubectl):
    """A `run` killed outright leaves its RayJob going on: the listing says so, with the
    command that stops it, and once the RayJob has ended lists it abandoned, not in flight."""
    from stateset_backend.runs.views import in_flight, record_submitted

    _, canned = kubectl
    canned({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"},
           {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    plan, store = _echo_plan(registry, echo_volume)
    attempt = store.begin_attempt(plan)  # applied by a `run` that no longer holds it
    name = rayjob_name(plan.run_id, attempt.number)
    (Path(os.environ["FAKE_KUBECTL_DIR"]) / f"{name}.json").write_text(
        json.dumps({"metadata": {"name": name}}))
    record_submitted(attempt.directory, "kuberay", f"team-a/{name}")
    running, = in_flight(store)
    assert (running["state"], running["job_state"], running["run_process"]) == (
        "running", "Running", "gone")
    assert running["reason"] == (f"job RUNNING; its `run` process is gone: the job goes on, but "
                                 f"nothing will record its result (kubectl delete rayjob {name} "
                                 "-n team-a stops it)")
    ended, = in_flight(store)
    assert (ended["state"], ended["job_state"]) == ("abandoned", "Complete")
    assert ended["reason"] == ("the RayJob ended Complete (job SUCCEEDED); its `run` process "
                               "is gone, so no result was recorded")

def test_the_timeout_deletes_the_rayjob(registry, echo_volume, kubectl):
    calls, canned = kubectl
    canned({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    plan, store = _echo_plan(registry, echo_volume)
    result, _ = run_plan(plan, registry, store, echo_stderr=False, apply=True, timeout=0.3)
    assert (result.status, result.exit_code) == ("failed", 124)
    name = rayjob_name(plan.run_id, 1)
    assert ["delete", "rayjob", name, "-n", "team-a", "--ignore-not-found",
            "--wait=false"] in calls()


def test_a_run_store_off_the_volume_is_refused_before_an_attempt(registry, echo_volume,
                                                                 tmp_path):
    plan, _ = _echo_plan(registry, echo_volume)
    store = RunStore(tmp_path / "elsewhere")
    with pytest.raises(InvalidInput, match="--runs-dir"):
        run_plan(plan, registry, store, echo_stderr=False)
    assert not (tmp_path / "elsewhere" / plan.run_id).exists()


def test_without_kubectl_apply_is_refused_saying_how_to_install_it(registry, echo_volume,
                                                                   monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    plan, store = _echo_plan(registry, echo_volume)
    with pytest.raises(Unsupported, match="kubectl is not on PATH"):
        run_plan(plan, registry, store, echo_stderr=False, apply=True)
    assert not (store.run_dir(plan.run_id) / "attempts").exists()  # refused before an attempt


@pytest.mark.parametrize("said", ["error: unable to connect to the server",
                                  'Error from server (Forbidden): rayjobs.ray.io is forbidden: '
                                  'User "dev" cannot create resource "rayjobs"'])
def test_a_manifest_the_cluster_refuses_ends_the_attempt_failed(registry, echo_volume, kubectl,
                                                               tmp_path, said):
    """kubectl apply fails (no server, no permission): the attempt still ends with a failed
    result, and kubectl's error is said once."""
    refuse = tmp_path / "bin" / "kubectl"
    refuse.write_text(f"#!/bin/sh\necho {shlex.quote(said)} >&2\nexit 1\n")
    plan, store = _echo_plan(registry, echo_volume)
    result, path = run_plan(plan, registry, store, echo_stderr=False, apply=True)
    assert result.status == "failed"
    detail = next(c.detail for c in result.checks if c.name == "exit_code")
    assert detail.startswith("never started: the RayJob was not created: ") and \
        detail.count(said) == 1, detail
    assert result.exit_code is None  # no engine ran to have one
    with pytest.raises(EngineFailed) as raised:
        raise_for_status(result, path)
    assert raised.value.message.count(said) == 1, raised.value.message
    assert "engine exited" not in raised.value.message


@pytest.mark.parametrize("status, expected", [
    ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, (0, False, False)),
    ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
      "message": "Job entrypoint command failed with exit code 3"}, (3, False, False)),
    ({"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed"},
     (1, False, False)),
    ({"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "DeadlineExceeded"},
     (124, False, True)),
    ({"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, (-15, False, False)),
    ({"jobDeploymentStatus": "Suspended", "jobStatus": "STOPPED"}, (-15, False, False)),
    ({"jobDeploymentStatus": "Failed", "reason": "SubmissionFailed"}, (1, False, False)),
    ({"jobDeploymentStatus": "ValidationFailed", "reason": "ValidationFailed",
      "message": "RayJob name should be no more than 47 characters"}, (1, False, False)),
    ({"jobDeploymentStatus": "Failed", "jobStatus": "SUCCEEDED",
      "reason": "JobDeploymentStatusTransitionGracePeriodExceeded"}, (1, False, False)),
])
def test_each_end_state_maps_to_its_outcome(status, expected):
    exit_ = to_exit(RayJobState.from_status(status), [])
    assert (exit_.code, exit_.interrupted, exit_.timed_out) == expected
    if expected[0]:
        assert exit_.reason  # the result says what KubeRay said


def test_a_deletion_by_the_user_or_the_timeout_is_named():
    assert to_exit(None, ["SIGINT"]).interrupted and to_exit(None, ["SIGINT"]).code == 130
    timed = to_exit(None, ["timeout"])
    assert timed.timed_out and timed.code == 124 and "timeout" in (timed.reason or "")
    assert "deleted" in (to_exit(None, []).reason or "")


def test_the_cli_plans_prepares_then_applies(registry, echo_volume, kubectl, tmp_path, capsys,
                                             monkeypatch):
    """Through the CLI, as the docs show it: plan with --kuberay-settings, run without
    --apply (exit 7, the manifest written, nothing run), then run --apply, which the re-run
    guard lets through because the earlier attempt only prepared."""
    from stateset_backend.cli import main

    calls, _ = kubectl
    monkeypatch.setenv("FAKE_KUBECTL_RUN", "1")
    spec, settings, store = echo_volume("ok")
    settings_file = tmp_path / "kuberay.json"
    settings_file.write_text(json.dumps(settings))
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--engine", "echo", "--engine-version", "1.2.0", str(spec), "-o",
                 str(plan_file), "--provider", "kuberay", "--kuberay-settings",
                 str(settings_file)]) == 0
    capsys.readouterr()
    assert main(["run", str(plan_file), "--runs-dir", str(store.root), "--quiet"]) == 7
    out, err = capsys.readouterr()
    # what was asked for, said as such: no error line, the apply command last, once
    assert "error" not in err + out and calls() == []
    run_id = json.loads(plan_file.read_text())["run_id"]
    manifest = store.run_dir(run_id) / "attempts" / "1" / RAYJOB_FILE
    lines = out.strip().splitlines()
    assert lines[0] == f"run {run_id} attempt 1: prepared, not applied (nothing ran)"
    assert lines[-1].strip() == f"kubectl apply --validate=strict -f {manifest}"
    assert sum("--apply" in line for line in lines) == 1
    assert main(["run", str(plan_file), "--runs-dir", str(store.root), "--quiet",
                 "--apply"]) == 0
    assert calls()[0][0] == "apply"
    assert main(["plan", "--engine", "echo", "--engine-version", "1.2.0", str(spec), "-o",
                 str(plan_file), "--provider", "kuberay"]) == 2
    local = tmp_path / "local-plan.json"
    assert main(["plan", "--engine", "echo", "--engine-version", "1.2.0", str(spec), "-o",
                 str(local)]) == 0
    capsys.readouterr()
    assert main(["run", str(local), "--runs-dir", str(store.root), "--apply"]) == 2
    assert "--apply applies a kuberay plan's RayJob" in capsys.readouterr().err


def test_a_later_attempt_of_the_run_gets_another_deadline(registry, echo_volume, kubectl,
                                                          tmp_path, capsys):
    """The KubeRay side of giving a run more time: --kuberay-deadline with --retry (or
    --resume) sets the new attempt's activeDeadlineSeconds; the plan stays as reviewed."""
    from stateset_backend.cli import main

    spec, settings, store = echo_volume("ok", active_deadline_seconds=600)
    settings_file = tmp_path / "kuberay.json"
    settings_file.write_text(json.dumps(settings))
    plan_file = tmp_path / "plan.json"
    assert main(["plan", "--engine", "echo", "--engine-version", "1.2.0", str(spec), "-o",
                 str(plan_file), "--provider", "kuberay", "--kuberay-settings",
                 str(settings_file)]) == 0
    run = ["run", str(plan_file), "--runs-dir", str(store.root), "--quiet"]
    assert main(run) == 7
    capsys.readouterr()
    assert main([*run, "--kuberay-deadline", "7200"]) == 2  # a first run: make a new plan
    line, = capsys.readouterr().err.strip().splitlines()
    assert "--kuberay-deadline gives a kuberay plan's run more time for --resume or --retry" \
        in line
    assert main([*run, "--retry", "--kuberay-deadline", "7200"]) == 7
    run_id = json.loads(plan_file.read_text())["run_id"]
    attempts = store.run_dir(run_id) / "attempts"
    deadlines = [yaml.safe_load((attempts / n / RAYJOB_FILE).read_text())["spec"]
                 ["activeDeadlineSeconds"] for n in ("1", "2")]
    assert deadlines == [600, 7200]
    stored = json.loads((store.run_dir(run_id) / "plan.json").read_text())
    assert stored == json.loads(plan_file.read_text())
