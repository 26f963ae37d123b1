"""Sample specs derived from what a contract claims: one per capability, on a base the engine
can plan.

The kit never hand-writes a spec per engine. It starts from a base built out of the capabilities
the contract claims at a version (a rollout backend, a dtype, an aggregation, an advantage
normalisation the release provides), merges the adapter's own ``base`` overrides, and derives
one sample per capability of the closed vocabulary: the base changed so that it needs exactly
that capability, with every other setting moved back onto what the release claims. A sample
for a claimed capability must plan; a sample for an unclaimed one must be refused (exit 3)
before anything could launch.

Data, reward and environment files are written for real into a folder, with their sha256,
in the format the adapter reads (``jsonl`` or ``parquet``), so adapters that count rows or
check suffixes at plan time see real files.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateset_backend.common.jsonio import put
from stateset_backend.contracts.capabilities import VOCABULARY, required_capabilities
from stateset_backend.contracts.loader import Contract, parse_version
from stateset_backend.spec.files import parse_spec

# the capabilities a spec cannot ask for (resume is asked for by a run, not a spec)
NOT_A_SPEC_SETTING = frozenset({"resume:exact"})
SAMPLED = tuple(sorted(VOCABULARY - NOT_A_SPEC_SETTING))

# a stored run's checkpoint; planning never reads the store (the run resolves it)
SAMPLE_FROM_RUN = {"run_id": "20260101T000000Z-00000000", "checkpoint": "update-000002",
                   "sha256": "e" * 64}
TRAIN_ROWS = 64
VALIDATION_ROWS = 16
REWARD_SOURCE = '''"""Conformance sample reward: 1 when the answer appears in the response to a
prompt (a shim that hands the reward no prompt scores nothing)."""


def score(prompt, response, answer):
    return float(bool(str(prompt).strip()) and str(answer) in str(response))
'''
ENVIRONMENT_SOURCE = '''"""Conformance sample environments (docs/environments.md)."""


class Env:
    def reset(self, task):
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, messages):
        return {"observations": [], "reward": 0.0, "done": True}


class ToolEnv(Env):
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "look the answer up",
        "parameters": {"type": "object", "properties": {}}}}]

    def step(self, messages):
        if messages[-1].get("tool_calls"):
            return {"observations": [{"role": "tool", "name": "lookup", "content": "42"}],
                    "reward": 0.0, "done": False}
        return {"observations": [], "reward": 1.0, "done": True}
'''


@dataclass(frozen=True)
class SampleFiles:
    """The real files sample specs point at, all inside ``root``."""

    root: Path
    data_format: str
    sha256: dict[str, str]

    def split(self, name: str) -> dict[str, Any]:
        uri = f"data/{name}.{self.data_format}"
        return {"uri": uri, "sha256": self.sha256[uri]}

    def reward(self) -> dict[str, Any]:
        return {"kind": "python", "entrypoint": "reward.py:score",
                "sha256": self.sha256["reward.py"]}

    def environment(self, kind: str) -> dict[str, Any]:
        """A conversation: ``tool_use`` talks with the environment that declares a tool."""
        name = "ToolEnv" if kind == "tool_use" else "Env"
        return {"kind": kind, "entrypoint": f"env.py:{name}", "sha256": self.sha256["env.py"],
                "max_turns": 2}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parquet_row(row: dict[str, str], index: int) -> dict[str, Any]:
    """A parquet row as the RL engines that read parquet expect it (verl's layout, which the
    others' loaders accept too): the prompt as chat messages, the answer where verl's reward
    manager takes it, the prompt's text where verl hands it to the reward; ``answer`` stays for
    the spec's ``answer_field``."""
    return {"data_source": "conformance",
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "answer": row["answer"],
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"prompt": row["prompt"], "index": index}}


def write_split(root: Path, name: str, records: list[dict[str, str]],
                data_format: str) -> dict[str, str]:
    """``records`` ({prompt, answer}) as ``data/<name>.<format>`` under ``root``, a parquet
    split in the engines' row layout; {relative path: sha256}."""
    path = root / "data" / f"{name}.{data_format}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if data_format == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    else:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise RuntimeError("parquet samples need pyarrow: pip install "
                               "'stateset-backend[conformance]'") from None
        pq.write_table(pa.Table.from_pylist(
            [parquet_row(r, i) for i, r in enumerate(records)]), path)
    return {f"data/{name}.{data_format}": _sha(path.read_bytes())}


def write_sample_files(root: Path, data_format: str = "jsonl") -> SampleFiles:
    """Write train/validation/test splits, a reward and an environment into ``root``."""
    if data_format not in ("jsonl", "parquet"):
        raise ValueError(f"data_format {data_format!r}: the kit writes jsonl or parquet")
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    sums: dict[str, str] = {}
    for name, rows in (("train", TRAIN_ROWS), ("validation", VALIDATION_ROWS),
                       ("test", VALIDATION_ROWS)):
        records = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}
                   for i in range(rows)]
        sums.update(write_split(root, name, records, data_format))
    for name, source in (("reward.py", REWARD_SOURCE), ("env.py", ENVIRONMENT_SOURCE)):
        (root / name).write_text(source, encoding="utf-8")
        sums[name] = _sha(source.encode())
    return SampleFiles(root, data_format, sums)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``; a None in ``over`` deletes the key."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _first(claimed: frozenset[str], family: str, prefer: tuple[str, ...]) -> str | None:
    names = [c.split(":", 1)[1] for c in claimed if c.startswith(family + ":")]
    for value in prefer:
        if value in names:
            return value
    return sorted(names)[0] if names else None


def base_doc(contract: Contract, version: str, files: SampleFiles,
             overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The simplest experiment the release claims to run: a group objective, the first
    claimed rollout backend and dtype, a python reward, no KL, no validation, no checkpoints.
    ``overrides`` (the adapter's ``base``) is merged last."""
    claimed = contract.provided(parse_version(version))
    objective = _first(claimed, "objective", ("grpo", "rloo", "dapo", "reinforce_pp", "gspo",
                                              "dr_grpo", "cispo", "ppo")) or "grpo"
    doc: dict[str, Any] = {
        "name": "conformance",
        "seed": 7,
        "algorithm": {"objective": objective, "group_size": 4, "kl": None},
        "model": {"path": "org/conformance-model"},
        # two limits apart: a launch that gives the one for the other reads differently
        "data": {"train": files.split("train"), "max_prompt_tokens": 96,
                 "max_response_tokens": 128},
        "reward": files.reward(),
        "rollout": {"backend": _first(claimed, "rollout", ("vllm", "hf", "sglang")) or "vllm"},
        "budget": {"total_updates": 4, "prompts_per_update": 8},
        "resources": {"nodes": 1, "gpus_per_node": 1},
    }
    dtype = _first(claimed, "dtype", ("bfloat16", "float32", "float16"))
    if dtype is not None:
        doc["model"]["dtype"] = dtype
        if dtype == "float16":
            doc["model"]["param_dtype"] = "float32"
    doc = _onto_claimed(doc, claimed, protect=frozenset())
    return deep_merge(doc, overrides or {})


# -- one change per capability -----------------------------------------------------------------
Change = Callable[[dict[str, Any], SampleFiles], None]


def _alg(doc: dict[str, Any]) -> dict[str, Any]:
    alg: dict[str, Any] = doc["algorithm"]
    return alg


def _objective(name: str) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        # the objective's own recipe fills the rest (spec defaults), then claimed settings;
        # sft takes no RL settings at all
        doc["algorithm"] = {"objective": name} if name == "sft" else \
            {"objective": name, "group_size": 1 if name == "ppo" else 4}

    return change


def _kl(placement: str | None = None, estimator: str | None = None) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        # explicit, so an objective's own KL recipe does not fill in another estimator
        kl = dict(_alg(doc).get("kl") or {"coef": 0.01, "estimator": "k3"})
        if placement is not None:
            kl["placement"] = placement
        if estimator is not None:
            kl["estimator"] = estimator
            kl.pop("clamp", None)
        _alg(doc)["kl"] = kl

    return change


def _set(path: str, value: Any) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        put(doc, path, copy.deepcopy(value))

    return change


def _both(*changes: Change) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        for c in changes:
            c(doc, files)

    return change


def _std(kind: str) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        adv = _alg(doc).setdefault("advantage", {})
        adv.update(std_normalize=True, std=kind)

    return change


def _conversation(kind: str) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        doc["reward"] = {"kind": "environment"}
        doc["environment"] = files.environment(kind)

    return change


def _reward(kind: str) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        if kind == "python":
            doc["reward"] = files.reward()
        elif kind == "environment":
            _conversation("multi_turn")(doc, files)
        else:
            doc["reward"] = {"kind": kind, "entrypoint": "org/reward-model" if kind == "model"
                             else "https://reward.example/score"}

    return change


def _validation(doc: dict[str, Any], files: SampleFiles) -> None:
    doc["data"]["validation"] = files.split("validation")
    doc["evaluation"] = {**doc.get("evaluation", {}), "every": 2}


def _shared_budget(doc: dict[str, Any], files: SampleFiles) -> None:
    """A budget that binds: below the two limits' sum, above the prompt limit."""
    data = doc["data"]
    data["max_total_tokens"] = data.get("max_prompt_tokens", 512) + \
        data.get("max_response_tokens", 512) // 2


def _dtype(name: str) -> Change:
    def change(doc: dict[str, Any], files: SampleFiles) -> None:
        doc["model"]["dtype"] = name
        if name != "bfloat16":
            doc["model"]["param_dtype"] = "float32"

    return change


def _candidates(capability: str) -> list[tuple[Change, frozenset[str]]]:
    """Ways to make the base need ``capability``, simplest first, each with the capabilities
    it brings in that the repair step must leave alone. An engine may honour a capability only
    together with another setting (a sequence-level ratio only in GSPO, zero-variance exclusion
    only with dynamic sampling): the capability is usable when any of these plans."""
    family, _, value = capability.partition(":")
    keep = frozenset({capability})
    if family == "objective":
        extra = frozenset({"ppo": {"critic"}, "gspo": {"ratio:sequence"}}.get(value, set()))
        return [(_objective(value), keep | extra),
                (_both(_objective(value), _set("algorithm.kl", None)), keep | extra)]
    simple: dict[str, Change] = {
        "ratio": _set("algorithm.ratio_level", value),
        "loss_agg": _set("algorithm.loss_aggregation", value),
        "rollout": _set("rollout.backend", value),
        "dtype": _dtype(value),
        "kl_estimator": _kl(estimator=value),
    }
    if family in simple:
        out = [(simple[family], keep)]
        if capability == "ratio:sequence":
            out.append((_objective("gspo"), keep | {"objective:gspo"}))
        return out
    if family == "kl":
        return [(_kl(placement=value), keep)] + [
            (_both(_objective(obj), _kl(placement=value)), keep | {f"objective:{obj}"})
            for obj in ("reinforce_pp", "rloo", "ppo")]
    if family == "advantage_std":
        return [(_std(value), keep),
                (_both(_std(value), _set("algorithm.advantage.scope", "batch")), keep),
                (_both(_objective("reinforce_pp"), _std(value)),
                 keep | {"objective:reinforce_pp"})]
    if family == "reward":
        extra = frozenset({"multi_turn"} if value == "environment" else set())
        return [(_reward(value), keep | extra)]
    if family == "rollout_correction":  # bounds off the engines' usual 0.5 / 5.0
        return [(_set("algorithm.rollout_correction",
                      {"mode": value, "low": 0.25, "high": 4.0}), keep)]
    dynamic = _both(_set("algorithm.advantage.zero_variance_groups", "exclude"),
                    _set("algorithm.dynamic_sampling", {"max_rounds": 2}))
    standalone: dict[str, list[tuple[Change, set[str]]]] = {
        "clip:asymmetric": [(_set("algorithm.clip", {"low": 0.2, "high": 0.28}), set())],
        "advantage:no_std_normalize": [
            (_set("algorithm.advantage.std_normalize", False), set())],
        "zero_variance:exclude": [
            (_set("algorithm.advantage.zero_variance_groups", "exclude"), set()),
            (dynamic, {"dynamic_sampling"})],
        "dynamic_sampling": [(dynamic, {"zero_variance:exclude"})],
        "overlong_penalty": [
            (_set("algorithm.overlong", {"buffer_tokens": 16, "penalty": 1.0}), set())],
        "entropy_bonus": [(_set("algorithm.entropy_coef", 0.001), set())],
        "shared_token_budget": [(_shared_budget, set())],
        "warmup_start": [(_both(_set("optim.warmup_steps", 2),
                                _set("optim.warmup_start_ratio", 0.1)), set())],
        "lora": [(_set("model.lora", {"rank": 8, "alpha": 16,
                                      "target_modules": ["q_proj", "v_proj"]}), set()),
                 (_set("model.lora", {"rank": 8, "alpha": 16}), set())],
        "multi_turn": [(_conversation("multi_turn"), {"reward:environment"})],
        "tool_use": [(_conversation("tool_use"), {"reward:environment"})],
        "critic": [(_objective("ppo"), {"objective:ppo"})],
        "validation": [(_validation, set())],
        "checkpoint": [(_set("checkpoint", {"every": 2, "keep": 2}), set())],
        "multi_node": [(_set("resources", {"nodes": 2, "gpus_per_node": 1}), set())],
        "sft:packed": [(_both(_objective("sft"), _set("algorithm.sft", {"layout": "packed"})),
                        {"objective:sft"})],
        "init:from_run": [(_set("model.from_run", SAMPLE_FROM_RUN), set())],
    }
    return [(change, keep | extra) for change, extra in standalone[capability]]


# -- moving everything else back onto what the release claims ---------------------------------
def _onto_claimed(doc: dict[str, Any], claimed: frozenset[str],
                  protect: frozenset[str]) -> dict[str, Any]:
    """Change settings whose capability the release does not claim (and the sample does not
    protect) to ones it claims. Returns the repaired document (the input is not changed)."""
    doc = copy.deepcopy(doc)
    for _ in range(4):  # each repair can expose another (dropping KL changes nothing else)
        try:
            spec = parse_spec(doc)
        except Exception:
            return doc  # not a valid spec: make_plan reports it
        missing = sorted(required_capabilities(spec) - claimed - protect)
        if not missing:
            return doc
        for cap in missing:
            _repair(doc, cap, claimed, protect)
    return doc


def _repair(doc: dict[str, Any], cap: str, claimed: frozenset[str],
            protect: frozenset[str]) -> None:
    family, _, value = cap.partition(":")
    alg = _alg(doc)
    kl_protected = any(p.startswith(("kl:", "kl_estimator:")) for p in protect)
    if family == "kl" and kl_protected and _first(claimed, "kl", ("loss", "reward")):
        alg["kl"] = {**alg["kl"], "placement": _first(claimed, "kl", ("loss", "reward"))}
    elif family == "kl_estimator" and kl_protected and \
            _first(claimed, "kl_estimator", ("k3", "k1", "k2")):
        estimator = _first(claimed, "kl_estimator", ("k3", "k1", "k2"))
        alg["kl"] = {k: v for k, v in alg["kl"].items() if k != "clamp"} | \
            {"estimator": estimator}
    elif family == "loss_agg":
        alg["loss_aggregation"] = _first(claimed, "loss_agg", (
            "token_mean", "seq_mean_token_mean", "seq_mean_token_sum",
            "seq_mean_token_sum_norm")) or value
    elif family in ("kl", "kl_estimator"):
        alg["kl"] = None
    elif family == "advantage_std":
        other = _first(claimed, "advantage_std", ("unbiased", "population"))
        adv = alg.setdefault("advantage", {})
        if other is not None:
            adv["std"] = other
        else:
            adv["std_normalize"] = False
    elif cap == "advantage:no_std_normalize":
        adv = alg.setdefault("advantage", {})
        adv["std_normalize"] = True
        adv["std"] = _first(claimed, "advantage_std", ("unbiased", "population")) or "unbiased"
    elif cap == "clip:asymmetric":
        clip = dict(alg.get("clip") or {"low": 0.2, "high": 0.2})
        clip["high"] = clip["low"] = min(max(clip.get("low", 0.2), 0.2), 0.2)
        alg["clip"] = clip
    elif cap in ("zero_variance:exclude", "dynamic_sampling"):
        alg["dynamic_sampling"] = None
        alg.setdefault("advantage", {})["zero_variance_groups"] = "keep"
    elif cap == "overlong_penalty":
        alg["overlong"] = None
    elif cap == "entropy_bonus":
        alg["entropy_coef"] = 0.0
    elif cap == "shared_token_budget":
        doc["data"].pop("max_total_tokens", None)
    elif cap == "warmup_start":
        doc.get("optim", {}).pop("warmup_start_ratio", None)
    elif family == "rollout_correction":
        alg.pop("rollout_correction", None)
    elif family == "ratio" and alg.get("objective") != "gspo":
        alg["ratio_level"] = "token" if value == "sequence" else "sequence"
    elif family == "rollout":
        doc["rollout"]["backend"] = _first(claimed, "rollout", ("vllm", "hf", "sglang")) or value
    elif family == "dtype":
        dtype = _first(claimed, "dtype", ("bfloat16", "float32", "float16"))
        if dtype is not None:
            _dtype(dtype)(doc, None)  # type: ignore[arg-type]
    elif cap == "lora":
        doc["model"].pop("lora", None)
    elif cap == "validation":
        doc.setdefault("evaluation", {})["every"] = None
    elif cap == "checkpoint":
        doc["checkpoint"] = {"every": None, "keep": None}
    elif cap == "multi_node":
        doc["resources"] = {"nodes": 1, "gpus_per_node": 1}


@dataclass(frozen=True)
class Sample:
    """A spec that needs ``capability``; ``doc`` is relative to ``SampleFiles.root``."""

    capability: str
    doc: dict[str, Any]
    claimed: bool


def samples_for(contract: Contract, version: str, capability: str, files: SampleFiles,
                overrides: dict[str, Any] | None = None,
                base: dict[str, Any] | None = None) -> list[Sample]:
    """The base changed to need ``capability``, one document per way of asking for it. When
    the release claims the capability, every other setting is moved back onto what the
    release claims; documents that no longer need the capability are dropped."""
    claimed = contract.provided(parse_version(version))
    is_claimed = capability in claimed
    out: list[Sample] = []
    start = base if base is not None else base_doc(contract, version, files, overrides)
    for change, protect in _candidates(capability):
        doc = copy.deepcopy(start)
        change(doc, files)
        if is_claimed:
            doc = _onto_claimed(doc, claimed, protect)
        try:
            if capability not in needs(doc):
                continue
        except Exception:
            pass  # an invalid document: planning it reports why
        if all(doc != s.doc for s in out):
            out.append(Sample(capability, doc, is_claimed))
    return out


def needs(doc: dict[str, Any]) -> frozenset[str]:
    """The capabilities a sample document requires."""
    return required_capabilities(parse_spec(doc))
