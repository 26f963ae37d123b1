"""OpenRLHF: the real parser of each release wheel accepts our argv (exact option strings),
its post-parse checks pass, and the values parse back to what the spec meant.

STATESET_TEST_OPENRLHF_WHEELS names a folder holding the release wheels: the first and last
release of every dialect (``.ci/run`` downloads them).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from golden import variant
from optional_installs import OPENRLHF_WHEELS_MISSING
from packaging.version import Version

from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import parse_spec

WHEELS = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")
PARSER = Path(__file__).with_name("openrlhf_parse.py")
DATA = Path(__file__).resolve().parents[2] / "examples" / "external" / "data"
TRAIN_ROWS = 2000  # examples/external/data/train.parquet

BASE: dict[str, Any] = {
    "name": "golden", "seed": 99,
    "algorithm": {"objective": "grpo", "group_size": 8},
    "model": {"path": "/models/qwen2.5-0.5b", "dtype": "bfloat16"},
    "data": {"train": {"uri": str(DATA / "train.parquet"), "sha256": "a" * 64},
             "validation": {"uri": str(DATA / "validation.parquet"), "sha256": "b" * 64},
             "max_prompt_tokens": 256, "max_response_tokens": 512,
             "prompt_overflow": "truncate_left"},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "rollout": {"backend": "vllm", "temperature": 0.8, "top_p": 0.95},
    "optim": {"lr": 1e-6, "betas": [0.9, 0.98], "eps": 1e-8, "weight_decay": 0.0,
              "grad_clip": 0.5, "warmup_steps": 7},
    "budget": {"total_updates": 25, "prompts_per_update": 16, "mini_batches": 1},
    "checkpoint": {"every": 20, "keep": 3},
    "evaluation": {"every": 10, "temperature": 0.6, "top_p": 0.95, "samples": 2},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}


def golden(algorithm: dict[str, Any], **model: Any) -> dict[str, Any]:
    """Token-mean aggregation unless asked: the only one every release has."""
    return variant(BASE, algorithm, algorithm_defaults={"loss_aggregation": "token_mean"}, **model)


def with_(doc: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(doc))
    for name, values in sections.items():
        out[name] = {**out.get(name, {}), **values}
    return out


GOLDEN = {
    "grpo": golden({"objective": "grpo"}),
    "grpo_kl_k2_loss": golden({"objective": "grpo", "kl": {"coef": 0.01, "estimator": "k2",
                                                           "placement": "loss"}}),
    "grpo_no_std": golden({"objective": "grpo", "advantage": {"std_normalize": False},
                           "clip": {"low": 0.2, "high": 0.28, "dual_clip": 3.0}}),
    # OpenRLHF's GSPO loss is always the sequence mean of token means
    "gspo": golden({"objective": "gspo", "loss_aggregation": "seq_mean_token_mean"}),
    "dapo_like": golden({"objective": "dapo", "loss_aggregation": "token_mean",
                         "overlong": {"buffer_tokens": 64, "penalty": 1.0}}),
    "rloo": golden({"objective": "rloo"}),
    "reinforce_pp": golden({"objective": "reinforce_pp"}),
    "ppo": golden({"objective": "ppo", "gae": {"gamma": 0.99, "lam": 0.95}}),
    "ppo_critic": golden({"objective": "ppo", "gae": {"critic": {
        "lr": 3e-6, "value_clip": None, "warmup_updates": 4}}}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 16, "alpha": 32, "dropout": 0.05,
                                                "target_modules": ["q_proj", "v_proj"]}),
    # cosine to a 10% floor (the only floor 0.9.8/0.10.1 have), two optimizer steps per update,
    # more updates than the split holds (several passes), no validation, keep every checkpoint
    "cosine_passes": with_(golden({"objective": "grpo"}),
                           optim={"schedule": "cosine", "min_lr_ratio": 0.1,
                                  "weight_decay": 0.01},
                           budget={"total_updates": 300, "prompts_per_update": 16,
                                   "mini_batches": 2},
                           checkpoint={"every": 50, "keep": None},
                           evaluation={"every": None}),
    "linear_no_template": with_(golden({"objective": "grpo"}),
                                optim={"schedule": "linear", "warmup_steps": 0},
                                data={"chat_template": False}),
}


def _plan(doc: dict[str, Any], version: str):
    entry = AdapterEntry(OpenRLHFAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))


def _wheel(version: str) -> Path:
    (wheel,) = Path(WHEELS or "").glob(f"openrlhf-{version}-*.whl")
    return wheel


def _run_parser(version: str, *args: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(PARSER), str(_wheel(version)), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _argv(plan, run_dir: Path) -> list[str]:
    return [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[3:]]


needs_wheels = pytest.mark.skipif(WHEELS is None, reason=OPENRLHF_WHEELS_MISSING)


@dataclass(frozen=True)
class Parsed:
    """A golden spec on one release: its plan and the folder that stands for its run
    directory, what the release's parser made of the launch (``error``: it refused), or why
    the spec was refused before launch."""

    plan: Any = None
    run_dir: Path | None = None
    got: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    refused: str | None = None


@pytest.fixture(scope="module")
def parsers(tmp_path_factory) -> tuple[dict[str, dict[str, Any]],
                                       dict[tuple[str, str], Parsed]]:
    """Every release parser's defaults, and every golden spec planned for every release and
    read by that release's parser: one interpreter runs them all (starting one is most of a
    parse's time). The tests that read it are one xdist_group, so one worker builds it."""
    root = tmp_path_factory.mktemp("openrlhf-parsed")
    jobs: list[dict[str, Any]] = [{"wheel": str(_wheel(v)), "defaults": True}
                                  for v in sorted(RELEASES)]
    planned: dict[tuple[str, str], Parsed] = {}
    for version in sorted(RELEASES):
        for name, doc in GOLDEN.items():
            try:
                plan = _plan(doc, version)
            except Unsupported as exc:
                planned[(name, version)] = Parsed(refused=str(exc))
                continue
            run_dir = root / version / name
            run_dir.mkdir(parents=True)
            planned[(name, version)] = Parsed(plan, run_dir)
            jobs.append({"wheel": str(_wheel(version)), "argv": _argv(plan, run_dir)})
    proc = subprocess.run([sys.executable, str(PARSER), "--batch"], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = iter(json.loads(proc.stdout.strip().splitlines()[-1]))
    defaults = {}
    for version in sorted(RELEASES):
        result = next(results)
        assert "error" not in result, result["error"][-3000:]
        defaults[version] = result["result"]
    for key, parsed in planned.items():
        if parsed.plan is not None:
            result = next(results)
            planned[key] = Parsed(parsed.plan, parsed.run_dir, result.get("result", {}),
                                  result.get("error"))
    return defaults, planned

FLAT = {"model": "pretrain", "estimator": "advantage_estimator", "n": "n_samples_per_prompt",
        "kl": "init_kl_coef", "kl_est": "kl_estimator", "kl_loss": "use_kl_loss",
        "kl_target": "kl_target", "clip": "eps_clip_low_high", "dual_clip": "dual_clip",
        "loss": "policy_loss_type", "seed": "seed", "lr": "actor_learning_rate",
        "critic_lr": "critic_learning_rate", "betas": "adam_betas", "eps": None, "wd": "l2",
        "max_norm": "max_norm", "sched": "lr_scheduler", "warmup": "lr_warmup_ratio",
        "min_lr": None, "rollout": "rollout_batch_size", "gen_batch": "vllm_generate_batch_size",
        "train": "train_batch_size", "epochs": "max_epochs", "episodes": "num_episodes",
        "max_samples": "max_samples", "lora": "lora_rank", "data": "prompt_data",
        "input": "input_key", "label": "label_key", "temp": "temperature", "top_p": "top_p",
        "new": "max_new_tokens", "max_len": "max_len", "template": "apply_chat_template",
        "run": "wandb_run_name", "ckpt": "ckpt_path", "no_std": "no_advantage_std_norm",
        "rm": "remote_rm_url", "overlong": "overlong_buffer_len", "gamma": "gamma",
        "lambd": "lambd", "entropy": "entropy_loss_coef", "eval_temp": "eval_temperature",
        "eval_n": "eval_n_samples_per_prompt", "eval_steps": "eval_steps",
        "save_steps": "save_steps", "max_num": "max_ckpt_num", "best": None,
        "dtype": "param_dtype", "reward_clip": "reward_clip_range",
        "filtering": "dynamic_filtering", "zero": "zero_stage", "value_clip": "value_clip",
        "freezing": "freezing_actor_steps"}
DOTTED = {"model": "actor.model_name_or_path", "estimator": "algo.advantage.estimator",
          "n": "rollout.n_samples_per_prompt", "kl": "algo.kl.init_coef",
          "kl_est": "algo.kl.estimator", "kl_loss": "algo.kl.use_loss",
          "kl_target": "algo.kl.target", "clip": "actor.eps_clip_low_high",
          "dual_clip": "actor.dual_clip", "loss": "actor.policy_loss_type",
          "seed": "train.seed", "lr": "actor.adam.lr", "critic_lr": "critic.adam.lr",
          "betas": "actor.adam.betas", "eps": "actor.adam.eps", "wd": "actor.adam.weight_decay",
          "max_norm": "actor.max_norm", "sched": "actor.lr_scheduler",
          "warmup": "actor.lr_warmup_ratio", "min_lr": "actor.min_lr_ratio",
          "rollout": "rollout.batch_size", "gen_batch": "rollout.vllm_generate_batch_size",
          "train": "train.batch_size", "epochs": "train.max_epochs",
          "episodes": "train.num_episodes", "max_samples": "data.max_samples",
          "lora": "ds.lora.rank", "data": "data.prompt_dataset", "input": "data.input_key",
          "label": "data.label_key", "temp": "rollout.temperature", "top_p": "rollout.top_p",
          "new": "rollout.max_new_tokens", "max_len": "data.max_len",
          "template": "data.apply_chat_template", "run": "logger.wandb.run_name",
          "ckpt": "ckpt.path", "no_std": "algo.advantage.no_std_norm",
          "rm": "reward.remote_url", "overlong": "reward.overlong_buffer_len",
          "gamma": "algo.advantage.gamma", "lambd": "algo.advantage.lambd",
          "entropy": "actor.entropy_coef", "eval_temp": "eval.temperature",
          "eval_n": "eval.n_samples_per_prompt", "eval_steps": "eval.steps",
          "save_steps": "ckpt.save_steps", "max_num": "ckpt.max_num",
          "best": "ckpt.best_metric_key", "dtype": "ds.param_dtype",
          "reward_clip": "reward.clip_range", "filtering": "algo.dynamic_filtering_enable",
          "zero": "ds.zero_stage", "value_clip": "critic.value_clip",
          "freezing": "critic.freezing_steps"}

# the first and last release of each dialect
RELEASES = {"0.9.8": FLAT, "0.10.1": {**FLAT, "best": "best_metric_key"}, "0.10.2": DOTTED,
            "0.11.1": DOTTED, "0.11.2": DOTTED}
ESTIMATOR = {"grpo": "group_norm", "gspo": "group_norm", "dapo": "group_norm", "rloo": "rloo",
             "reinforce_pp": "reinforce_baseline", "ppo": "gae"}


def _normal(value: Any) -> Any:
    """The parser dump's JSON form of a default (inf becomes the contract's "inf")."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


@needs_wheels
@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_recorded_defaults_are_the_parsers_own(version, parsers):
    """Every default the contract records is what that release's parser really defaults to."""
    dialect = OpenRLHFAdapter().contract.dialect(Version(version))
    real = parsers[0][version]
    assert {k: _normal(real[k]) for k in dialect.defaults} == dialect.defaults
    # and every switch the launch fixes is a real option of this release
    assert not set(OpenRLHFAdapter().keys(dialect).fixed) - set(real)


@needs_wheels
@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_real_parser_accepts_our_argv_and_parses_back(name, version, parsers):
    doc = GOLDEN[name]
    spec = parse_spec(doc)
    names = RELEASES[version]
    parsed = parsers[1][(name, version)]
    if parsed.refused is not None:
        pytest.skip(f"refused before launch: {parsed.refused}")
    plan, run_dir = parsed.plan, parsed.run_dir
    dialect = plan.resolved_dialect()
    assert set(dialect.defaults) <= set(plan.native)  # every recorded default is pinned
    assert parsed.error is None, parsed.error[-3000:]
    got = parsed.got

    def v(key: str) -> Any:
        return got[names[key]]

    a, o, b, e = spec.algorithm, spec.optim, spec.budget, spec.evaluation
    std_off = not a.advantage.std_normalize
    assert v("model") == "/models/qwen2.5-0.5b"
    assert v("estimator") == ("dr_grpo" if a.objective == "grpo" and std_off
                              else ESTIMATOR[a.objective])
    assert v("n") == a.group_size and v("seed") == 99
    assert list(v("clip")) == [a.clip.low, a.clip.high] and v("dual_clip") == a.clip.dual_clip
    assert v("loss") == ("gspo" if a.objective == "gspo" else "ppo")
    assert v("kl") == (a.kl.coef if a.kl else 0.0) and v("kl_target") is None
    assert v("kl_loss") == (a.kl is not None and a.kl.placement == "loss")
    if a.kl is not None:
        assert v("kl_est") == a.kl.estimator
    # only the batch whitening reads no_std_norm
    assert v("no_std") == (std_off and a.objective in ("reinforce_pp", "ppo"))
    assert list(v("reward_clip")) == [-1e15, 1e15]
    assert v("filtering") is (a.dynamic_sampling is not None)
    assert v("entropy") == a.entropy_coef
    # optimizer: betas always passed (the release default is 0.9, 0.95)
    assert v("lr") == o.lr
    if a.gae is not None:  # the critic: its own LR, value clip and actor-frozen updates
        c = a.gae.critic
        assert v("critic_lr") == c.lr
        assert v("value_clip") == (c.value_clip if c.value_clip is not None else 1e9)
        assert v("freezing") == c.warmup_updates - 1
    assert list(v("betas")) == list(o.betas) and v("wd") == o.weight_decay
    assert v("max_norm") == o.grad_clip
    if names["eps"]:
        assert v("eps") == o.eps
    assert v("sched") == {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr",
                          "linear": "linear"}[o.schedule]
    if names["min_lr"]:
        assert v("min_lr") == o.min_lr_ratio
    # the budget: OpenRLHF's own step count (ppo_trainer max_steps) and update count
    k = b.ppo_epochs * b.mini_batches
    max_steps = v("max_samples") * a.group_size // v("train") * v("episodes") * v("epochs")
    assert max_steps == b.total_updates * k
    assert v("episodes") * (v("max_samples") // v("rollout")) == b.total_updates
    assert v("max_samples") % v("rollout") == 0 and v("max_samples") <= TRAIN_ROWS
    assert (v("rollout"), v("gen_batch"), v("epochs")) == (16, 16, b.ppo_epochs)
    assert v("train") == 16 * a.group_size // b.mini_batches
    assert math.ceil(max_steps * v("warmup")) == o.warmup_steps * k  # exact warmup steps
    # prompts, sampling, validation decoding
    assert (v("new"), v("max_len")) == (512, 768) and v("template") is spec.data.chat_template
    assert (v("temp"), v("top_p")) == (0.8, 0.95)
    assert (v("eval_temp"), v("eval_n")) == (e.temperature, e.samples)
    assert v("eval_steps") == (e.every if e.every is not None else -1)
    assert (v("data"), v("input"), v("label")) == (str(DATA / "train.parquet"), "prompt",
                                                   "answer")
    # checkpoints: rotation keeps `keep` (or all), newest first, no best-metric checkpoints
    assert v("save_steps") == spec.checkpoint.every
    assert v("max_num") == (spec.checkpoint.keep or 2**31 - 1)
    if names["best"]:
        assert v("best") == "none"
    assert v("dtype") == "bf16" and v("zero") == 2
    assert v("lora") == (16 if spec.model.lora else 0)
    if not spec.model.lora:  # the LoRA-off pin reads back as the list the plan records
        flag = OpenRLHFAdapter().keys(dialect).target_modules
        assert got[flag.removeprefix("--")] == plan.native[flag] == ["all-linear"]
    assert v("run") == f"{plan.run_id}.{plan.experiment_digest.removeprefix('sha256:')}"
    assert v("ckpt") == f"{run_dir}/checkpoints"
    rm = v("rm")
    assert (rm if isinstance(rm, str) else rm[0]) == f"{run_dir}/stateset_reward.py"
    if a.overlong is not None:
        assert v("overlong") == 64
    assert (v("gamma"), v("lambd")) == ((a.gae.gamma, a.gae.lam) if a.gae else (1.0, 1.0))


@needs_wheels
@pytest.mark.parametrize("version", sorted(RELEASES))
def test_shipped_surfaces_are_the_release_parsers_own(version):
    """The option surface plans check ``engine_options`` against, regenerated from the wheel
    by the command that wrote it, is byte for byte the one shipped; its defaults agree with
    the contract's recorded ones."""
    from importlib import resources

    from stateset_backend.conformance import surface_gen

    (wheel,) = Path(WHEELS or "").glob(f"openrlhf-{version}-*.whl")
    shipped = resources.files("stateset_backend.contracts").joinpath(
        "surfaces", f"openrlhf-{version}.json").read_text()
    generated = surface_gen.render(surface_gen.openrlhf_surface(wheel))
    assert generated == shipped, "regenerate: python -m stateset_backend.conformance." \
        f"surface_gen openrlhf {wheel} -o stateset_backend/contracts/surfaces"
    options = json.loads(shipped)["options"]
    dialect = OpenRLHFAdapter().contract.dialect(Version(version))
    assert {k: _normal(options[k]["default"]) for k in dialect.defaults} == \
        {k: _normal(v) for k, v in dialect.defaults.items()}


@needs_wheels
@pytest.mark.xdist_group(__name__)
def test_every_flag_is_an_exact_option_string(parsers):
    """argparse would accept an abbreviation; ours must be the option strings themselves."""
    for version in RELEASES:
        options = set(parsers[0][version])
        for name, doc in GOLDEN.items():
            try:
                flags = [a.split("=", 1)[0] for a in _plan(doc, version).argv
                         if a.startswith("--")]
            except Unsupported:
                continue
            assert not set(flags) - options, (version, name, set(flags) - options)


def test_warmup_ratio_lands_on_whole_steps():
    """ceil(steps * W/T) overshoots for many (W, T): 25 * (7/25) is 7.000000000000001."""
    from stateset_backend.adapters.openrlhf.budget import warmup_ratio

    for total in range(1, 120):
        for warmup in range(0, total + 1):
            spec = parse_spec(with_(GOLDEN["grpo"], optim={"warmup_steps": warmup},
                                    budget={"total_updates": total, "mini_batches": 2}))
            assert math.ceil(total * 2 * warmup_ratio(warmup, spec)) == warmup * 2


@pytest.mark.parametrize("total, rows, batch, expected", [
    (25, 2000, 16, (1, 400)), (300, 2000, 16, (3, 1600)), (7, 100, 16, (7, 16)),
    (125, 2000, 16, (1, 2000)), (126, 2000, 16, (2, 1008))])
def test_passes_run_exactly_the_updates(total, rows, batch, expected):
    from stateset_backend.adapters.openrlhf.budget import passes

    spec = parse_spec(with_(GOLDEN["grpo"], budget={"total_updates": total,
                                                    "prompts_per_update": batch}))
    episodes, kept = passes(spec, rows)
    assert (episodes, kept) == expected and episodes * (kept // batch) == total


def test_a_split_that_cannot_be_counted_is_refused(tmp_path):
    doc = with_(GOLDEN["grpo"], data={"train": {"uri": str(tmp_path / "train.csv"),
                                                "sha256": "a" * 64}})
    with pytest.raises(Unsupported, match="OpenRLHF has no step limit"):
        _plan(doc, "0.11.2")
    doc["data"]["train"]["uri"] = str(tmp_path / "small.jsonl")
    (tmp_path / "small.jsonl").write_text('{"prompt": "a", "answer": "b"}\n' * 3)
    with pytest.raises(InvalidInput, match="fewer than one update's 16 prompts"):
        _plan(doc, "0.11.2")


@pytest.mark.parametrize("version, change, missing", [
    ("0.11.2", {"algorithm": {"objective": "gspo", "loss_aggregation": "token_mean"}},
     "algorithm.loss_aggregation: OpenRLHF's GSPO loss is always the mean over sequences"),
    ("0.10.2", {"algorithm": {"objective": "grpo", "loss_aggregation": "seq_mean_token_mean"}},
     "loss_agg:seq_mean_token_mean (available in openrlhf >=0.11.2)"),
    # older releases name generation and precision flags differently (--generate_max_len)
    ("0.9.7", {}, "openrlhf 0.9.7 is not supported (supported: openrlhf >=0.9.8)"),
    ("0.11.2", {"algorithm": {"objective": "grpo", "kl": {"coef": 0.01, "clamp": 5.0}}},
     "algorithm.kl.clamp: OpenRLHF clamps the KL estimate to [-10, 10]"),
    ("0.11.2", {"optim": {"schedule": "linear", "min_lr_ratio": 0.1}},
     "optim.min_lr_ratio: OpenRLHF's linear schedule decays to 0"),
    ("0.11.0", {"optim": {"schedule": "linear"}}, "optim.schedule: OpenRLHF before 0.11.1"),
    ("0.10.1", {"optim": {"schedule": "cosine", "min_lr_ratio": 0.0}},
     "optim.min_lr_ratio: openrlhf flat-best-checkpoint always uses 0.1"),
    ("0.10.1", {"optim": {"eps": 1e-6}}, "optim.eps: openrlhf flat-best-checkpoint always uses"),
    ("0.11.2", {"rollout": {"top_k": 20}}, "rollout.top_k: OpenRLHF always samples without"),
    ("0.11.2", {"data": {"prompt_overflow": "error"}}, "data.prompt_overflow: OpenRLHF "
                                                       "truncates an over-long prompt"),
    ("0.11.2", {"data": {"shuffle": False}}, "data.shuffle: OpenRLHF always shuffles"),
    ("0.11.2", {"model": {"param_dtype": "bfloat16"}}, "model.param_dtype: OpenRLHF keeps"),
    ("0.11.2", {"model": {"dtype": "float32"}}, "missing dtype:float32"),
    ("0.11.2", {"evaluation": {"top_p": 0.5}}, "evaluation.top_p: OpenRLHF validates with"),
    ("0.11.2", {"algorithm": {"objective": "grpo", "advantage": {"std_normalize": True,
                                                                 "std": "population"}}},
     "algorithm.advantage.std: openrlhf dotted always uses unbiased"),
])
def test_what_an_openrlhf_version_cannot_honour_is_refused(version, change, missing):
    doc = golden(change.pop("algorithm", {"objective": "grpo"}))
    with pytest.raises(Unsupported, match=missing.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        _plan(with_(doc, **change), version)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_declared_deviations_are_recorded_and_strict_refuses_them(version):
    doc = with_(golden({"objective": "grpo", "kl": {"coef": 0.01, "estimator": "k1"}}),
                optim={"weight_decay": 0.01, "schedule": "cosine", "min_lr_ratio": 0.1},
                budget={"mini_batches": 2}, data={"prompt_overflow": "drop"})
    plan = _plan(doc, version)
    by_setting = {d["setting"]: d["deviation"] for d in plan.deviations}
    assert by_setting == {
        "algorithm.kl.clamp": "kl_clamped_to_10",
        "algorithm.advantage.epsilon": "group_std_plus_1e-9",
        "optim.weight_decay": "weight_decay_spares_bias_and_norm",
        "optim.warmup_steps": "lr_warmup_per_optimizer_step",
        "optim.schedule": "lr_decay_per_optimizer_step",
        "budget.partial_batch": "fixed_train_rows",
        "data.shuffle": "unseeded_prompt_order",
        "data.prompt_overflow": "overlong_prompt_truncated_left",
        "rollout.backend": "min_one_response_token",
        **({"algorithm.loss_aggregation": "token_mean_per_micro_batch"}
           if Version(version) < Version("0.11.1") else {}),
    }
    assert all(d["description"] for d in plan.deviations)
    with pytest.raises(Unsupported, match="refused under equivalence: strict"):
        _plan({**doc, "equivalence": "strict"}, version)


def test_batch_whitening_and_dynamic_filtering_are_declared():
    plan = _plan(golden({"objective": "reinforce_pp"}), "0.11.2")
    batch = {d["setting"]: d["deviation"] for d in plan.deviations}
    assert batch["algorithm.advantage.epsilon"] == "batch_variance_floor_1e-8"
    assert batch["algorithm.advantage.std"] == "batch_population_std"
    dapo = {d["setting"]: d["deviation"] for d in _plan(golden({"objective": "dapo"}),
                                                        "0.11.2").deviations}
    assert dapo["algorithm.advantage.zero_variance_groups"] == "zero_variance_by_mean_score"
    assert dapo["algorithm.dynamic_sampling.max_rounds"] == "refill_without_round_limit"
    assert dapo["budget.total_updates"] == "refill_consumes_prompts"


def test_flags_follow_the_dialect():
    old = [a.split("=", 1)[0] for a in _plan(golden({"objective": "grpo"}), "0.10.1").argv]
    new = [a.split("=", 1)[0] for a in _plan(golden({"objective": "grpo"}), "0.10.2").argv]
    assert "--pretrain" in old and "--actor.model_name_or_path" not in old
    assert "--actor.model_name_or_path" in new and "--pretrain" not in new
