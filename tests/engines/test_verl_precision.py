"""Every model verl builds from the policy's weights computes in the spec's precision, on every
release the contract supports, as that release's own code decides it.

The KL reference must compute exactly as the actor does: while the policy equals the reference
(the first update) the KL is then exactly 0. A reference left at verl's defaults runs in
bfloat16 under a float32 spec and the KL starts at 5.6e-5. The critic must compute in the
spec's precision too. Each launch is composed on the release's own Hydra config, and the
release's own worker code (``verl_precision_probe.py``, in verl's interpreter) says which
dtypes each model is loaded in, wrapped with and run under; where a release cannot honour the
spec, the plan declares or refuses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from optional_installs import VERL_PYTHON_MISSING, VERL_WHEELS_MISSING
from packaging.version import Version
from test_verl import (
    RELEASES,
    VERL_PYTHON,
    VERL_WHEELS,
    _hub_cache,
    _installed_verl_dir,
    _overrides,
    _plan,
    golden,
)

from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.common.errors import Unsupported

PROBE = Path(__file__).with_name("verl_precision_probe.py")
TORCH = {"bfloat16": "torch.bfloat16", "float16": "torch.float16", "float32": "torch.float32"}
KL = {"coef": 0.01, "estimator": "k3", "placement": "loss"}
SPECS: dict[str, dict[str, Any]] = {
    "grpo_float32": golden({"objective": "grpo", "kl": KL}, dtype="float32"),
    "grpo_bfloat16": golden({"objective": "grpo", "kl": KL}, dtype="bfloat16"),
    "ppo_float32": golden({"objective": "ppo"}, dtype="float32"),
    "ppo_bfloat16_weights": golden({"objective": "ppo"}, dtype="bfloat16",
                                   param_dtype="bfloat16"),
}
CASES = [(v, name) for v in RELEASES for name in SPECS]

pytestmark = pytest.mark.skipif(VERL_PYTHON is None, reason=VERL_PYTHON_MISSING)


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    return _hub_cache(tmp_path / "hub", monkeypatch)


def _release_package(version: str, into: Path) -> str:
    """The release's verl package folder: its config, worker code and dtype names."""
    if version == "0.9.1":
        return str(_installed_verl_dir())
    assert VERL_WHEELS is not None
    wheel = next(Path(VERL_WHEELS).glob(f"verl-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith(("verl/trainer/config/", "verl/workers/")) or \
                    name == "verl/utils/torch_dtypes.py":
                archive.extract(name, into)
    return str(into / "verl")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, str], Any]:
    """Each (release, spec): the Unsupported refusal, or (plan, what the release's code builds).
    One verl interpreter reads them all."""
    root = tmp_path_factory.mktemp("verl-precision")
    out: dict[tuple[str, str], Any] = {}
    jobs, keys = [], []
    with pytest.MonkeyPatch.context() as mp:
        cache = _hub_cache(root / "hub", mp)
        packages = {v: _release_package(v, root / v) for v in RELEASES
                    if v == "0.9.1" or VERL_WHEELS is not None}
        for version, name in CASES:
            if version not in packages:
                continue
            try:
                plan = _plan(SPECS[name], version)
            except Unsupported as exc:
                out[version, name] = exc
                continue
            out[version, name] = plan
            keys.append((version, name))
            jobs.append({"verl": packages[version], "installed": version == "0.9.1",
                         "overrides": _overrides(plan, root / "run")})
    proc = subprocess.run([VERL_PYTHON or "", str(PROBE)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key, report in zip(keys, json.loads(proc.stdout.strip().splitlines()[-1]), strict=True):
        assert "error" not in report, (key, report["error"][-3000:])
        out[key] = (out[key], report)
    return out


def _case(built: dict[tuple[str, str], Any], version: str, name: str) -> Any:
    if (version, name) not in built:
        pytest.skip(VERL_WHEELS_MISSING)
    return built[version, name]


def _dialect_keys(version: str) -> dict[str, Any]:
    return VerlAdapter().contract.dialect(Version(version)).keys


@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("version, name", CASES)
def test_the_reference_and_critic_are_built_in_the_actors_precision(built, version, name):
    """What verl's own code loads, wraps and runs each model in: the reference and the critic
    exactly as the actor, the spec's param_dtype for the weights, its dtype for the compute."""
    got = _case(built, version, name)
    spec = SPECS[name]["model"]
    if isinstance(got, Unsupported):  # only the critic's bfloat16 autocast refuses a spec
        assert name == "ppo_float32", got
        assert _dialect_keys(version)["critic_autocast"] == "bfloat16"
        return
    plan, models = got
    weights, compute = TORCH[spec.get("param_dtype", "float32")], TORCH[spec["dtype"]]
    actor, ref, critic = models["actor"], models["ref"], models["critic"]
    for role, model in models.items():
        assert (model["load"], model["param"], model["reduce"], model["buffer"]) == \
            (weights, compute, "torch.float32", "torch.float32"), (role, model)
    assert ref == actor, "the KL reference computes differently from the actor"
    declared = {d["deviation"] for d in plan.deviations}
    if actor["compute"] != compute:  # verl runs the forward under bfloat16 autocast
        assert actor["compute"] == "torch.bfloat16" and "bf16_autocast" in declared
    else:
        assert "bf16_autocast" not in declared
    if SPECS[name]["algorithm"]["objective"] == "ppo":
        assert critic["compute"] == compute, critic


@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("version", RELEASES)
def test_the_contract_says_what_each_release_autocasts(built, version):
    """The dialect's autocast keys are what the release's code does under a float32 spec."""
    _, models = _case(built, version, "grpo_float32")
    keys = _dialect_keys(version)
    assert (models["actor"]["autocast"] == "torch.bfloat16") == (keys["autocast"] == "bfloat16")
    assert (models["critic"]["autocast"] == "torch.bfloat16") == \
        (keys["critic_autocast"] == "bfloat16")


@pytest.mark.parametrize("version", ["0.4.1", "0.6.0"])
def test_a_bfloat16_forward_is_declared_and_refused_under_strict(version):
    plan = _plan(SPECS["grpo_float32"], version)
    assert [d["setting"] for d in plan.deviations if d["deviation"] == "bf16_autocast"] == \
        ["model.dtype"]
    with pytest.raises(Unsupported) as info:
        _plan({**SPECS["grpo_float32"], "equivalence": "strict"}, version)
    assert any(r.startswith("model.dtype:") and "'bf16_autocast'" in r
               for r in info.value.details["refused"])
    assert "bf16_autocast" not in {d["deviation"] for d in
                                   _plan(SPECS["grpo_bfloat16"], version).deviations}


@pytest.mark.parametrize("version", ["0.4.1", "0.6.1", "0.7.1"])
def test_ppo_computes_in_float32_only_where_the_critic_can(version):
    with pytest.raises(Unsupported) as info:
        _plan(SPECS["ppo_float32"], version)
    (reason,) = [r for r in info.value.details["refused"] if r.startswith("model.dtype:")]
    assert "critic's forward under torch.autocast(bfloat16)" in reason and ">= 0.8" in reason
    for later in ("0.8.0", "0.9.1"):
        _plan(SPECS["ppo_float32"], later)
    _plan(SPECS["ppo_bfloat16_weights"], version)  # the critic's weights follow param_dtype
