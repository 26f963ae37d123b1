"""User strings are data, on every engine and dialect release: hostile values in every
user-controlled string field of a spec (name, model path, prompt/answer fields, LoRA target
modules, labels, an ``engine_options`` value) read back verbatim through the engine's own
parser, nothing else in the launch changes, no interpolation resolves (``STATESET_PROBE`` is
set to a sentinel while the config is resolved), and ``--help`` in a value is a value; and
``engine_options`` keys that would delete, add over, override or shadow a key the adapter
pins, in any spelling, are refused at plan time (exit 2).

verl composes in verl's own interpreter (STATESET_TEST_VERL_PYTHON: 0.9.1) against each
release's own trainer config (STATESET_TEST_VERL_WHEELS: the earlier releases); OpenRLHF
parses with each release wheel's own parser (STATESET_TEST_OPENRLHF_WHEELS); NeMo RL applies
the overrides in struct mode to the pinned grpo_math_1B.yaml of each tag, as run_grpo.py does.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from optional_installs import (
    NEMO_RL_CONFIGS,
    NEMO_RL_CONFIGS_MISSING,
    OPENRLHF_WHEELS_MISSING,
    VERL_PYTHON_MISSING,
    VERL_WHEELS_MISSING,
)
from packaging.version import Version

from stateset_backend.adapters.nemo_rl import launcher as nemo_rl_launcher
from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.engines.adapter import identity_name
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate import overrides

# the tests read the batches each engine's parser reads once (read_verl, read_openrlhf,
# read_nemo): one pytest-xdist worker runs them all, so each batch is read once
pytestmark = pytest.mark.xdist_group(__name__)

HERE = Path(__file__).resolve().parent
VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
VERL_WHEELS = os.environ.get("STATESET_TEST_VERL_WHEELS")
OPENRLHF_WHEELS = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")
NEMO_CONFIGS = NEMO_RL_CONFIGS
EXAMPLES = HERE.parents[1] / "examples" / "external"
DATA = EXAMPLES / "data"

SENTINEL = "stateset-injection-sentinel-5f2c"
HOSTILE = ["${oc.env:STATESET_PROBE}", "a'b", "--help", "x,y", "k=v", "a b", "\\", "[1]",
           "{a:1}", "ünï"]
# every user-controlled string field a spec has; one spec per rotation gives each field a
# different hostile value, and over the rotations each field gets every hostile value
FIELDS = ("name", "model", "train_prompt", "train_answer", "val_prompt", "val_answer", "lora",
          "label", "option")
BENIGN = {"name": "benign", "model": "/models/benign", "train_prompt": "prompt",
          "train_answer": "answer", "val_prompt": "vprompt", "val_answer": "vanswer",
          "lora": "q_proj", "label": "benign", "option": "benign"}
RUN = "RUN-NAME"  # the run id and digest differ per plan: normalised before reading back
RUN_DIR = "/runs/r1"

# the first and last release of every dialect in each contract
VERL_RELEASES = ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                 "0.9.1"]
OPENRLHF_RELEASES = ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"]
NEMO_RELEASES = ["0.5.0", "0.6.0", "0.7.0"]

COMMON: dict[str, Any] = {
    "seed": 7,
    "algorithm": {"objective": "grpo", "group_size": 8, "loss_aggregation": "token_mean"},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "budget": {"total_updates": 25, "prompts_per_update": 16, "mini_batches": 1},
    "checkpoint": {"every": 10, "keep": 2},
    "evaluation": {"every": 5},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}
BASES: dict[str, dict[str, Any]] = {
    "verl": {**COMMON, "data": {
        "train": {"uri": "/data/train.parquet", "sha256": "a" * 64},
        "validation": {"uri": "/data/val.parquet", "sha256": "b" * 64},
        "max_prompt_tokens": 256, "max_response_tokens": 512},
        "rollout": {"backend": "vllm", "temperature": 0.9}},
    "openrlhf": {**COMMON, "data": {
        "train": {"uri": str(DATA / "train.parquet"), "sha256": "a" * 64},
        "validation": {"uri": str(DATA / "validation.parquet"), "sha256": "b" * 64},
        "max_prompt_tokens": 256, "max_response_tokens": 512,
        "prompt_overflow": "truncate_left"},
        "rollout": {"backend": "vllm", "temperature": 0.8, "top_p": 0.95},
        "evaluation": {"every": 5, "top_p": 0.95}},
    "nemo-rl": {**COMMON, "data": {
        "train": {"uri": "data/train.parquet", "sha256": "3d1b7fce7fd775e3492fbba18f2f3291"
                                                         "3b0bf691da76d96fff7ba87dea614dba"},
        "validation": {"uri": "data/validation.parquet",
                       "sha256": "54f01d5e5bc189190468bd70ac5ef2c0"
                                 "fb757fc654fc0765e1e166c1f3f29507"},
        "max_prompt_tokens": 256, "max_response_tokens": 512},
        "rollout": {"backend": "vllm", "temperature": 0.7}},
}
ADAPTERS = {"verl": VerlAdapter(), "openrlhf": OpenRLHFAdapter(), "nemo-rl": NemoRLAdapter()}
BASE_DIRS = {"verl": Path("/"), "openrlhf": Path("/"), "nemo-rl": EXAMPLES}
# one spec field can only hold what another already holds: verl and OpenRLHF read one prompt
# field (and OpenRLHF one answer field) for both splits
TIED = {"verl": {"val_prompt": "train_prompt"},
        "openrlhf": {"val_prompt": "train_prompt", "val_answer": "train_answer"},
        "nemo-rl": {}}
# (engine, field, value) the adapter refuses with InvalidInput instead of passing on: checked
# as a refusal below, and replaced by a benign value in the read-back specs
REFUSED_VALUES = {("openrlhf", "lora", "--help"): "an argparse list item starting with '-' "
                                                  "would be read as an option",
                  **{("verl", field, HOSTILE[0]): "verl resolves its config in place, then "
                     "Hydra's instantiate again: no escape carries '${' through every read"
                     for field in ("model", "train_prompt", "val_prompt", "lora", "option")}}


def _entry(engine: str) -> AdapterEntry:
    return AdapterEntry(ADAPTERS[engine], "builtin", "stateset-backend", "0.1.0")


def _keys(engine: str, version: str) -> Any:
    adapter = ADAPTERS[engine]
    return adapter.keys(adapter.contract.dialect(Version(version)))


def option_key(engine: str, version: str) -> str:
    """A free-text key of the release that no spec field maps to."""
    if engine == "verl":
        return "trainer.validation_data_dir"
    if engine == "nemo-rl":
        return "logger.wandb.project"
    return "--wandb_project" if Version(version) < Version("0.10.2") else \
        "--logger.wandb.project"


@functools.cache
def _lora_plans(engine: str, version: str) -> bool:
    from stateset_backend.common.errors import Unsupported

    try:
        _plan(engine, version, benign(engine), lora=True)
    except Unsupported:
        return False
    return True


def targets(engine: str, version: str) -> dict[str, tuple[str, ...]]:
    """Where each field's value must read back: ("config", key) in the engine's parsed
    config (a ("config", key, "list") as the one item of a list), ("launcher", split, field) in
    the NeMo RL launcher's JSON, or ("nowhere",): the field never reaches the engine."""
    nowhere = ("nowhere",)
    if engine == "verl":
        return {"name": ("slug", "trainer.project_name"),
                "model": ("config", "actor_rollout_ref.model.path"),
                "train_prompt": ("config", "data.prompt_key"),
                "val_prompt": ("config", "data.prompt_key"),
                "train_answer": nowhere, "val_answer": nowhere,  # reward_model.ground_truth
                "lora": ("config", "actor_rollout_ref.model.target_modules", "list"),
                "label": nowhere, "option": ("config", option_key(engine, version))}
    if engine == "openrlhf":
        k = _keys(engine, version)
        dest = lambda flag: flag.removeprefix("--")  # noqa: E731
        return {"name": nowhere, "model": ("config", dest(k.model)),
                "train_prompt": ("config", dest(k.input_key)),
                "val_prompt": ("config", dest(k.input_key)),
                "train_answer": ("config", dest(k.label_key)),
                "val_answer": ("config", dest(k.label_key)),
                "lora": ("config", dest(k.target_modules), "list"),
                "label": nowhere, "option": ("config", dest(option_key(engine, version)))}
    k = _keys(engine, version)
    return {"name": nowhere, "model": ("config", "policy.model_name"),
            "train_prompt": ("launcher", "train", "prompt_field"),
            "train_answer": ("launcher", "train", "answer_field"),
            "val_prompt": ("launcher", "validation", "prompt_field"),
            "val_answer": ("launcher", "validation", "answer_field"),
            "lora": ("config", f"{k.lora}.target_modules", "list") if k.lora else nowhere,
            "label": nowhere, "option": ("config", option_key(engine, version))}


def rotation(engine: str, j: int) -> dict[str, str]:
    values = {f: HOSTILE[(i + j) % len(HOSTILE)] for i, f in enumerate(FIELDS)}
    for field, same in TIED[engine].items():
        values[field] = values[same]
    return values


def _doc(engine: str, version: str, values: dict[str, str], lora: bool) -> dict[str, Any]:
    doc = copy.deepcopy(BASES[engine])
    doc["name"] = values["name"]
    doc["labels"] = {"team": values["label"]}
    doc["model"] = {"path": values["model"], "dtype": "bfloat16"}
    if lora:
        doc["model"]["lora"] = {"rank": 8, "alpha": 16, "target_modules": [values["lora"]]}
    for split in ("train", "validation"):
        short = "val" if split == "validation" else split
        doc["data"][split].update(prompt_field=values[f"{short}_prompt"],
                                  answer_field=values[f"{short}_answer"])
    doc["engine_options"] = {engine: {option_key(engine, version): values["option"]}}
    return doc


def _plan(engine: str, version: str, values: dict[str, str], lora: bool) -> LaunchPlan:
    return make_plan(parse_spec(_doc(engine, version, values, lora)), _entry(engine), version,
                     base_dir=BASE_DIRS[engine])


def _tail(engine: str, plan: LaunchPlan) -> list[str]:
    """The arguments the engine parses, with the run folder filled in and the run name (run
    id and experiment digest, different for every plan) normalised."""
    marker, after = {"verl": ("verl.trainer.main_ppo", 1),
                     "openrlhf": ("openrlhf.cli.train_ppo_ray", 1),
                     "nemo-rl": ("--config", 2)}[engine]
    start = plan.argv.index(marker) + after
    name = identity_name(plan.run_id, plan.experiment_digest)
    return [a.replace("{run_dir}", RUN_DIR).replace(name, RUN) for a in plan.argv[start:]]


def benign(engine: str) -> dict[str, str]:
    return dict(BENIGN, **{field: BENIGN[same] for field, same in TIED[engine].items()})


@functools.cache
def scenarios(engine: str, version: str) -> dict[str, tuple[dict[str, str], LaunchPlan]]:
    """The benign baseline and one spec per rotation of the hostile values, planned."""
    lora = _lora_plans(engine, version)
    out = {"baseline": (benign(engine), _plan(engine, version, benign(engine), lora))}
    for j in range(len(HOSTILE)):
        values = rotation(engine, j)
        for (e, field, value) in REFUSED_VALUES:
            if e == engine and values[field] == value:
                values[field] = benign(engine)[field]
        out[f"rotation{j}"] = (values, _plan(engine, version, values, lora))
    return out


def once(fn: Any) -> Any:
    """functools.cache that also remembers a failure, so a broken batch fails every test that
    needs it at once instead of running again for each."""
    memo: dict[Any, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        if args not in memo:
            try:
                memo[args] = (True, fn(*args))
            except Exception as exc:
                memo[args] = (False, exc)
        ok, value = memo[args]
        if not ok:
            raise value
        return value

    return wrapper


# -- reading every launch back with the engine's own parser -------------------------------------
def _verl_config_dir(version: str, into: Path) -> Path:
    if version == "0.9.1":
        out = subprocess.run([VERL_PYTHON or "", "-c", "import importlib.util; print(importlib"
                              ".util.find_spec('verl').submodule_search_locations[0])"],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        return Path(out.strip()) / "trainer" / "config"
    wheel = next(Path(VERL_WHEELS or "").glob(f"verl-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("verl/trainer/config/"):
                archive.extract(name, into / version)
    return into / version / "verl" / "trainer" / "config"


@once
def read_verl(tmp: str) -> dict[str, dict[str, Any]]:
    """Every verl release available: {version: {scenario: flat config | error}}."""
    jobs, index = [], []
    for version in VERL_RELEASES:
        if _verl_skip(version):
            continue
        config_dir = _verl_config_dir(version, Path(tmp))
        for label, (_, plan) in scenarios("verl", version).items():
            jobs.append({"config_dir": str(config_dir), "overrides": _tail("verl", plan)})
            index.append((version, label))
    # the installed verl composes with its own Hydra (without it, the project's Hydra reads
    # the wheels' configs); Hydra reads every YAML file again for each composition, so the
    # jobs run in a few processes side by side
    python = VERL_PYTHON or sys.executable
    chunks = max(1, min(4, os.cpu_count() or 1))
    env = {**os.environ, "STATESET_PROBE": SENTINEL, "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([python, str(HERE / "injection_verl.py")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(chunks)]
    results: list[Any] = [None] * len(jobs)
    outputs = [proc.communicate(json.dumps(jobs[i::chunks]), timeout=300) for i, proc in
               enumerate(procs)]
    for i, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, stderr[-3000:]
        results[i::chunks] = json.loads(stdout)
    out: dict[str, dict[str, Any]] = {}
    for (version, label), result in zip(index, results, strict=True):
        out.setdefault(version, {})[label] = result
    return out


@once
def read_openrlhf() -> dict[str, dict[str, Any]]:
    jobs, index = [], []
    for version in OPENRLHF_RELEASES:
        (wheel,) = Path(OPENRLHF_WHEELS or "").glob(f"openrlhf-{version}-*.whl")
        for label, (_, plan) in scenarios("openrlhf", version).items():
            jobs.append({"wheel": str(wheel), "argv": _tail("openrlhf", plan)})
            index.append((version, label))
    proc = subprocess.run([sys.executable, str(HERE / "injection_openrlhf.py")],
                          input=json.dumps(jobs), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "STATESET_PROBE": SENTINEL})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, dict[str, Any]] = {}
    for (version, label), result in zip(index, json.loads(proc.stdout), strict=True):
        if "args" in result:
            result["config"] = result.pop("args")
        else:
            result["error"] = f"the parser exited ({result['exit']}): " \
                              f"{result['stdout'][-500:]}{result['stderr'][-500:]}"
        out.setdefault(version, {})[label] = result
    return out


@once
def read_nemo() -> dict[str, dict[str, Any]]:
    """run_grpo.py's own override path: Hydra's override parser, applied in struct mode to the
    tag's YAML, then resolved with the probe variable set."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("mul", lambda a, b: a * b, replace=True)
    out: dict[str, dict[str, Any]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATESET_PROBE", SENTINEL)
        for version in NEMO_RELEASES:
            base = OmegaConf.load(NEMO_CONFIGS / f"v{version}" / "examples" / "configs" /
                                  "grpo_math_1B.yaml")
            for label, (_, plan) in scenarios("nemo-rl", version).items():
                cfg = copy.deepcopy(base)
                OmegaConf.set_struct(cfg, True)
                try:
                    parsed = OverridesParser.create().parse_overrides(
                        overrides=_tail("nemo-rl", plan))
                    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
                    result = {"config": OmegaConf.to_container(cfg, resolve=True)}
                except Exception as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"}
                result["launcher"] = json.loads(plan.files[nemo_rl_launcher.CONFIG_FILE])
                out.setdefault(version, {})[label] = result
    return out


def _verl_skip(version: str) -> str | None:
    if VERL_PYTHON is None and version == "0.9.1":
        return VERL_PYTHON_MISSING
    if VERL_WHEELS is None and version != "0.9.1":
        return VERL_WHEELS_MISSING
    return None


def _skip(engine: str, version: str) -> str | None:
    if engine == "verl":
        return _verl_skip(version)
    if engine == "openrlhf" and OPENRLHF_WHEELS is None:
        return OPENRLHF_WHEELS_MISSING
    if engine == "nemo-rl":
        if not NEMO_CONFIGS.is_dir():
            return NEMO_RL_CONFIGS_MISSING
        try:
            import hydra  # noqa: F401
        except ImportError:
            return "hydra-core is not installed"
    return None


@pytest.fixture(scope="module")
def verl_tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("verl-configs"))


def read_back(engine: str, version: str, verl_tmp: str) -> dict[str, Any]:
    reason = _skip(engine, version)
    if reason:
        pytest.skip(reason)
    results = {"verl": lambda: read_verl(verl_tmp), "openrlhf": read_openrlhf,
               "nemo-rl": read_nemo}[engine]()
    return results[version]


RELEASES = [("verl", v) for v in VERL_RELEASES] + [("openrlhf", v) for v in OPENRLHF_RELEASES] + \
    [("nemo-rl", v) for v in NEMO_RELEASES]


@pytest.mark.parametrize("engine, version", RELEASES, ids=[f"{e}-{v}" for e, v in RELEASES])
def test_hostile_strings_change_only_their_own_keys(engine, version, verl_tmp):
    """Every launch parses; the config read back differs from the benign baseline's only in
    leaves that hold, verbatim, a hostile value of a field that reaches the engine; no key
    appears or disappears; the sentinel is nowhere."""
    results = read_back(engine, version, verl_tmp)
    specs = scenarios(engine, version)
    plan_targets = targets(engine, version)
    for label, result in results.items():
        assert "error" not in result, (label, result.get("error"))
        assert SENTINEL not in json.dumps(result), label
    baseline = flatten(results["baseline"]["config"])
    for label, result in results.items():
        if label == "baseline":
            continue
        values, plan = specs[label]
        reaching = {values[f] for f, t in plan_targets.items() if t[0] == "config"} | \
            {overrides.slug(values[f], "stateset") for f, t in plan_targets.items()
             if t[0] == "slug"}
        config = flatten(result["config"])
        assert config.keys() == baseline.keys(), (label, config.keys() ^ baseline.keys())
        for key, got in config.items():
            if got == baseline[key]:
                continue
            items = got if isinstance(got, list) else [got]
            assert items and all(item in reaching for item in items), \
                (label, key, got, baseline[key])
        # labels and the name are kept as data in the plan, verbatim
        assert plan.spec["name"] == values["name"]
        assert plan.spec["labels"] == {"team": values["label"]}


CASES = [(e, v, f) for e, v in RELEASES for f in FIELDS]


@pytest.mark.parametrize("engine, version, field", CASES,
                         ids=[f"{e}-{v}-{f}" for e, v, f in CASES])
def test_each_hostile_value_reads_back_verbatim(engine, version, field, verl_tmp):
    target = targets(engine, version)[field]
    if field == "lora" and not _lora_plans(engine, version):
        pytest.skip(f"{engine} {version} refuses LoRA (no lora capability)")
    results = read_back(engine, version, verl_tmp)
    seen = set()
    for label, (values, _) in scenarios(engine, version).items():
        if label == "baseline":
            continue
        value = values[field]
        seen.add(value)
        result = results[label]
        assert "error" not in result, (label, result.get("error"))
        if target[0] == "config":
            got = flatten(result["config"]).get(target[1], KeyError)
            assert got == ([value] if target[2:] == ("list",) else value), (label, got, value)
        elif target[0] == "slug":  # a folder name to the engine: the name made safe
            got = flatten(result["config"])[target[1]]
            assert got == overrides.slug(value, "stateset"), (label, got, value)
            assert re.fullmatch(r"[A-Za-z0-9._-]+", got) and got not in (".", ".."), got
        elif target[0] == "launcher":
            assert result["launcher"]["splits"][target[1]][target[2]] == value
        else:  # never reaches the engine: no leaf holds it
            leaves = flatten(result["config"]).values()
            assert not any(leaf == value or (isinstance(leaf, list) and value in leaf)
                           for leaf in leaves), (label, value)
    expected = set(HOSTILE) - {v for (e, f, v) in REFUSED_VALUES if (e, f) == (engine, field)}
    assert seen >= expected


@pytest.mark.parametrize("engine, field, value", sorted(REFUSED_VALUES))
def test_values_an_adapter_cannot_carry_are_refused(engine, field, value):
    for version in {"verl": VERL_RELEASES, "openrlhf": OPENRLHF_RELEASES,
                    "nemo-rl": NEMO_RELEASES}[engine]:
        values = {**benign(engine), field: value}
        for tied, same in TIED[engine].items():  # a tied pair holds one value
            if field in (tied, same):
                values[tied] = values[same] = value
        with pytest.raises(InvalidInput) as info:
            _plan(engine, version, values, lora=True)
        assert info.value.exit_code == 2


def test_help_in_a_value_does_not_trigger_help():
    """'--help' as a model path, field name, LoRA module or option value reaches the parser
    as a value: every OpenRLHF parse returned arguments (none printed usage and exited)."""
    if OPENRLHF_WHEELS is None:
        pytest.skip(OPENRLHF_WHEELS_MISSING)
    for version, results in read_openrlhf().items():
        for label, result in results.items():
            assert "config" in result, (version, label, result.get("error"))
            assert "usage:" not in result.get("error", ""), (version, label)


# -- engine_options keys -------------------------------------------------------------------------
def _hostile_keys(engine: str, plan: LaunchPlan) -> list[tuple[str, Any]]:
    native = plan.native
    if engine == "openrlhf":
        k = _keys(engine, plan.engine_version)
        pinned = k.lr[0]
        assert pinned in native
        return [(f"~{pinned}", None), (f"+{pinned}", 1e-3), (f"++{pinned}", 1e-3),
                (f"{pinned}=x", 1e-3), (pinned[:-2], 1e-3), (pinned[1:], 1e-3),
                (k.model[:len(k.model) - 3], "/models/other"), (f"{k.run_name}", "x"),
                ("-h", True), ("a=b", "x")]
    pinned = "data.train_batch_size" if engine == "verl" else "loss_fn.ratio_clip_min"
    parent = "actor_rollout_ref.actor" if engine == "verl" else "loss_fn"
    assert pinned in native and any(key.startswith(parent + ".") for key in native)
    added = [key for key in native if key.startswith("+")]
    return [(f"~{pinned}", None), (f"+{pinned}", 1), (f"++{pinned}", 1), (f"{pinned}=x", 1),
            (parent, {"clip_ratio": 0.3}), (pinned.split(".")[0], {"x": 1}),
            ("a=b", 1), ("${x}", 1), ("a b", 1), ("x@pkg", 1),
            *[(key.lstrip("+"), 1) for key in added],
            *[(f"++{key.lstrip('+')}", 1) for key in added],
            *[(f"~{key.lstrip('+')}", None) for key in added]]


KEY_RELEASES = [(e, v) for e, v in RELEASES]


@pytest.mark.parametrize("engine, version", KEY_RELEASES,
                         ids=[f"{e}-{v}" for e, v in KEY_RELEASES])
def test_hostile_engine_option_keys_are_refused_at_plan_time(engine, version):
    plan = _plan(engine, version, benign(engine), lora=False)
    for key, value in _hostile_keys(engine, plan):
        doc = _doc(engine, version, benign(engine), lora=False)
        doc["engine_options"] = {engine: {key: value}}
        with pytest.raises(InvalidInput) as info:
            make_plan(parse_spec(doc), _entry(engine), version, base_dir=BASE_DIRS[engine])
        assert info.value.exit_code == 2, key


@pytest.mark.parametrize("version", OPENRLHF_RELEASES)
def test_openrlhf_aliases_of_a_pinned_flag_are_refused(version):
    """Option strings that write the same argument as a pinned flag (as the release's parser
    declares them) are the same setting: refused like the flag itself."""
    if OPENRLHF_WHEELS is None:
        pytest.skip(OPENRLHF_WHEELS_MISSING)
    plan = scenarios("openrlhf", version)["baseline"][1]
    groups = read_openrlhf()[version]["baseline"]["dests"]
    for group in groups:
        if not any(option in plan.native for option in group):
            continue
        for option in group:
            if option in plan.native or not option.startswith("--"):
                continue
            doc = _doc("openrlhf", version, benign("openrlhf"), lora=False)
            doc["engine_options"] = {"openrlhf": {option: True}}
            with pytest.raises(InvalidInput):
                make_plan(parse_spec(doc), _entry("openrlhf"), version, base_dir=Path("/"))


@pytest.mark.parametrize("item", ["-1e5", "-1."])
def test_list_items_argparse_reads_as_options_never_reach_it(item):
    """A list item is refused at plan time or parses back as that item."""
    if OPENRLHF_WHEELS is None:
        pytest.skip(OPENRLHF_WHEELS_MISSING)
    values = {**benign("openrlhf"), "lora": item}
    try:
        plan = _plan("openrlhf", "0.11.2", values, lora=True)
    except InvalidInput:
        return
    (wheel,) = Path(OPENRLHF_WHEELS).glob("openrlhf-0.11.2-*.whl")
    proc = subprocess.run([sys.executable, str(HERE / "injection_openrlhf.py")],
                          input=json.dumps([{"wheel": str(wheel),
                                             "argv": _tail("openrlhf", plan)}]),
                          capture_output=True, text=True, timeout=120)
    (result,) = json.loads(proc.stdout)
    assert result.get("args", {}).get("ds.lora.target_modules") == [item], result
