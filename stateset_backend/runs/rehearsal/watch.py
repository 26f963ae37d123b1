"""What the engine did, seen where the hub holds the pen, held to what the spec asks.

An adapter can describe its launch wrongly and consistently: the translation, its reader and
its stub then agree with each other and the engine still does something else. So a rehearsal
also watches the engine through what the hub writes itself. The reward shim records every call
the engine makes to the spec's reward (``REWARD_CALLS_ENV``); the engine's own logged learning
rate is read back through the collector. From them:

- **reward calls**: the train split is scored exactly ``updates x prompts_per_update x
  group_size`` times (more only where dynamic sampling may draw again: up to its rounds, or
  without bound where the plan declares the engine refills until full), each prompt a whole
  number of groups, every completion within ``data.max_response_tokens`` tokens of the
  spec's tokenizer, nothing outside the spec's splits, the test split never;
- **validation**: the validation split is scored, whole and ``evaluation.samples`` times per
  prompt, after every ``evaluation.every``-th update (an engine may also validate before the
  first update and after the last), and never when the spec asks for no validation (under
  dynamic sampling, where the calls cannot place a pass, the passes are counted);
- **learning rate**: the rate the engine logged for each update is the spec's schedule's.

The calls come in the order the engine made them; a validation pass is a run of calls on the
validation split, and the train calls before it say after which update it came.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.runs.rehearsal.verdict import Line
from stateset_backend.spec.environment_protocol import read_rows
from stateset_backend.spec.inputs import REWARD_CALLS_ENV, local_path
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.schedule import NEXT_LR, lr_within

CALLS_FILE = "reward_calls.jsonl"  # in the attempt folder
ROUNDS = "algorithm.dynamic_sampling.max_rounds"
SPLITS = ("train", "validation", "test")
LR_TOLERANCE = 1e-6  # relative: a logged float of the rate; a schedule off by a step is far more
Counter_ = Callable[[str], int]


def environment(run_dir: Path) -> dict[str, str]:
    """What the engine's environment gets so that its reward shim records its calls."""
    return {REWARD_CALLS_ENV: str(run_dir / CALLS_FILE)}


def read_calls(run_dir: Path) -> list[dict[str, Any]] | None:
    """The recorded calls in order, or None when the engine never called the shim."""
    path = run_dir / CALLS_FILE
    if not path.is_file():
        return None
    calls = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            calls.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a process killed while writing it
    return calls


def _prompt_key(value: Any) -> str:
    """The text a prompt field's value reaches the reward with: the text itself, or the last
    user message of a conversation."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m.get("content") for m in value if isinstance(m, dict)
                 and m.get("role") == "user" and isinstance(m.get("content"), str)]
        if users:
            return str(users[-1])
    return json.dumps(value, sort_keys=True)


def split_prompts(spec: ExperimentSpec, base_dir: Path) -> dict[str, set[str]]:
    """Each local split's prompts, as the reward sees them."""
    out: dict[str, set[str]] = {}
    for name in SPLITS:
        split = getattr(spec.data, name)
        path = None if split is None else local_path(split.uri, base_dir)
        if split is None or path is None:
            continue
        out[name] = {_prompt_key(row.get(split.prompt_field)) for row in read_rows(str(path))}
    return out


def classify(prompt: str, splits: dict[str, set[str]]) -> str:
    """Which split a scored prompt is from: the split holding it as it is, or (a chat template
    wraps it) the one split whose prompt it contains; ``?`` when none, ``=`` when several."""
    exact = [name for name, prompts in splits.items() if prompt in prompts]
    if len(exact) == 1:
        return exact[0]
    if exact:
        return "="
    inside = {name for name, prompts in splits.items() for p in prompts if p and p in prompt}
    return inside.pop() if len(inside) == 1 else ("=" if inside else "?")


def _updates(steps: list[int]) -> str:
    return ("update " if len(steps) == 1 else "updates ") + ", ".join(map(str, steps))


def reward_calls(spec: ExperimentSpec, base_dir: Path, run_dir: Path, updates: int,
                 count_tokens: Counter_ | None, launched: bool,
                 deviations: list[dict[str, Any]] | None = None) -> list[Line]:
    """The "reward calls" and "validation" lines (see the module docstring); ``deviations``
    are the plan's (one on ``dynamic_sampling.max_rounds`` lifts the bound on the rounds)."""
    names = ("reward calls", "validation")
    if spec.algorithm.objective == "sft":
        return [Line(n, "not measured", "objective sft scores nothing") for n in names]
    if spec.reward.kind != "python":
        why = (f"a {spec.reward.kind} reward is not scored through the hub's reward shim")
        return [Line(n, "not measured", why) for n in names]
    if not launched:
        return [Line(n, "not measured", "the engine did not finish") for n in names]
    calls = read_calls(run_dir)
    if not calls:
        return [Line(names[0], "FAILED", "the engine never called the hub's reward shim: it "
                                         "scored its completions some other way, so the spec's "
                                         "pinned reward may not be what it trained on"),
                Line(names[1], "not measured", "no reward call was recorded")]
    try:
        splits = split_prompts(spec, base_dir)
    except (OSError, ValueError) as exc:  # a row the engine skipped, which json cannot read
        why = f"the spec's splits cannot be read back here: {exc}"
        return [Line(n, "not measured", why) for n in names]
    kinds = [classify(str(c.get("prompt", "")), splits) for c in calls]
    unbounded = next((d.get("deviation", "") for d in deviations or ()
                      if d.get("setting") == ROUNDS), None)
    return [_train_calls(spec, calls, kinds, updates, count_tokens, unbounded),
            _validation(spec, splits, calls, kinds, updates)]


def _train_calls(spec: ExperimentSpec, calls: list[dict[str, Any]], kinds: list[str],
                 updates: int, count_tokens: Counter_ | None, unbounded: str | None) -> Line:
    name = "reward calls"
    seen = Counter(kinds)
    if seen["?"] or seen["test"]:
        stray = [c["prompt"] for c, k in zip(calls, kinds, strict=True) if k in ("?", "test")]
        what = (f"{seen['test']} on the test split, which only `evaluate` may score"
                if seen["test"] else "") + ("; " if seen["test"] and seen["?"] else "") + (
            f"{seen['?']} on prompts in none of the spec's splits" if seen["?"] else "")
        return Line(name, "FAILED", f"{len(calls)} calls, {what} (first: {stray[0][:80]!r})",
                    numbers={"calls": len(calls), "test": seen["test"], "unknown": seen["?"]})
    group = spec.algorithm.group_size
    want = updates * spec.budget.prompts_per_update * group
    rounds = spec.algorithm.dynamic_sampling.max_rounds + 1 \
        if spec.algorithm.dynamic_sampling is not None else 1
    train = [c for c, k in zip(calls, kinds, strict=True) if k == "train"]
    per_prompt = Counter(str(c["prompt"]) for c in train)
    ragged = sorted(p for p, n in per_prompt.items() if n % group)
    numbers: dict[str, Any] = {"train_calls": len(train), "expected": want,
                               "prompts": len(per_prompt), "ambiguous": seen["="]}
    plan = (f"{updates} updates x {spec.budget.prompts_per_update} prompts x "
            f"{group} completions")
    bound = (f", as many rounds of dynamic sampling as it takes: the plan declares "
             f"{unbounded})" if unbounded and rounds > 1 else
             f", up to {rounds} rounds of dynamic sampling)" if rounds > 1 else ")")
    if not (want <= len(train) + seen["="] and (len(train) <= want * rounds or
                                                (unbounded and rounds > 1))):
        return Line(name, "FAILED", f"the engine scored {len(train)} train completions; the "
                                    f"spec asks for {want} ({plan}{bound}", numbers=numbers)
    if ragged:
        return Line(name, "FAILED", f"{len(ragged)} prompts were scored a number of times that "
                                    f"is no multiple of group_size {group} (first: "
                                    f"{ragged[0][:60]!r}, {per_prompt[ragged[0]]} times)",
                    numbers=numbers)
    detail = f"{len(train)} train completions scored, as the spec asks ({plan}{bound}"
    limit = spec.data.max_response_tokens
    if count_tokens is not None:
        longest = max((count_tokens(str(c.get("response", ""))) for c in train), default=0)
        numbers["longest_tokens"] = longest
        if longest > limit:
            return Line(name, "FAILED", f"{detail}, but a completion of {longest} tokens "
                                        f"reached the reward: data.max_response_tokens is "
                                        f"{limit}", numbers=numbers)
        detail += f"; the longest completion {longest} tokens (limit {limit})"
    else:
        detail += "; completion lengths not measured (no tokenizer)"
    return Line(name, "ok", detail, numbers=numbers)


def _validation(spec: ExperimentSpec, splits: dict[str, set[str]], calls: list[dict[str, Any]],
                kinds: list[str], updates: int) -> Line:
    name = "validation"
    every = spec.evaluation.every
    per_update = spec.budget.prompts_per_update * spec.algorithm.group_size
    runs = _runs(kinds)
    passes: list[tuple[int, int]] = []  # (after update, calls in the pass)
    for trained, n in runs:
        after = trained // per_update
        if passes and passes[-1][0] == after:
            passes[-1] = (after, passes[-1][1] + n)
        else:
            passes.append((after, n))
    if every is None or spec.data.validation is None:
        if passes:
            return Line(name, "FAILED", f"the spec asks for no validation, but the engine "
                                        f"scored the validation split after "
                                        f"{_updates([u for u, _ in passes])}")
        return Line(name, "ok", "none, as the spec asks")
    asked = list(range(every, updates + 1, every))
    size = len(splits.get("validation", ())) * spec.evaluation.samples
    if spec.algorithm.dynamic_sampling is not None:
        return _validation_counted(runs, asked, updates, every, size)
    when = [u for u, _ in passes]
    numbers = {"asked": asked, "passes": [{"after": u, "calls": n} for u, n in passes],
               "pass_size": size}
    missing = [u for u in asked if u not in when]
    extra = [u for u in when if u not in asked and u not in (0, updates)]
    wrong = [(u, n) for u, n in passes if size and n != size]
    if missing or extra:
        done = _updates(when) if when else "no update"
        return Line(name, "FAILED", f"the engine validated after {done}; the spec asks for "
                                    f"every {every} (after "
                                    f"{_updates(asked) if asked else 'no update yet'})",
                    numbers=numbers)
    if wrong:
        u, n = wrong[0]
        return Line(name, "FAILED", f"the pass after update {u} scored {n} completions; the "
                                    f"validation split's {len(splits.get('validation', ()))} "
                                    f"prompts x evaluation.samples {spec.evaluation.samples} "
                                    f"is {size}", numbers=numbers)
    if not passes:
        return Line(name, "ok", f"none yet: the spec asks for every {every} updates, and the "
                                f"rehearsal ran {updates}", numbers=numbers)
    also = [u for u in when if u not in asked]
    beyond = ["before update 1" if u == 0 else f"after update {u}" for u in also]
    besides = f" (and {', '.join(beyond)})" if beyond else ""
    head = f"after {_updates(asked)}, as the spec asks{besides}" if asked else \
        f"none due in {updates} updates at every {every}, as the spec asks{besides}"
    return Line(name, "ok", f"{head}; {size} completions a pass", numbers=numbers)


def _runs(kinds: list[str]) -> list[tuple[int, int]]:
    """Each unbroken run of validation calls, as (train calls before it, its calls)."""
    runs: list[tuple[int, int]] = []
    trained, last = 0, ""
    for kind in kinds:
        if kind == "validation":
            runs.append((trained, runs.pop()[1] + 1) if last == "validation" else (trained, 1))
        elif kind == "train":
            trained += 1
        last = kind if kind in ("train", "validation") else last
    return runs


def _validation_counted(runs: list[tuple[int, int]], asked: list[int], updates: int,
                        every: int, size: int) -> Line:
    """Validation under dynamic sampling, where an update scores as many train completions as
    its rounds take, so the calls cannot say after which update a pass came: the passes after
    training began are counted (the asked ones, and one after the last update at most), and
    each must be whole."""
    name = "validation"
    later = [n for before, n in runs if before > 0]
    numbers = {"asked": asked, "passes_after_training": len(later), "pass_size": size,
               "calls": [n for _, n in runs]}
    unknown = "with dynamic sampling the calls cannot say after which update a pass came"
    if len(later) not in (len(asked), len(asked) + 1):
        return Line(name, "FAILED", f"the engine validated {len(later)} times once training "
                                    f"began; the spec asks for {len(asked)} in {updates} "
                                    f"updates (every {every}; one more after the last is "
                                    f"allowed), and {unknown}", numbers=numbers)
    wrong = [n for _, n in runs if size and n != size]
    if wrong:
        return Line(name, "FAILED", f"a pass scored {wrong[0]} completions; the validation "
                                    f"split's prompts x evaluation.samples is {size}",
                    numbers=numbers)
    return Line(name, "ok", f"{len(later)} passes once training began for {len(asked)} asked "
                            f"(every {every} of {updates} updates; {unknown}); {size} "
                            "completions a pass", numbers=numbers)


# the deviations that say an engine's scheduler steps with its optimizer (TRL's, OpenRLHF's):
# a plugin declaring one of these names gets its rate held to the schedule advanced per step
PER_STEP = frozenset({"lr_warmup_per_optimizer_step", "lr_decay_per_optimizer_step"})


def per_step(spec: ExperimentSpec, deviations: list[dict[str, Any]]) -> int:
    """Optimizer steps an update where the plan declares the schedule advanced per optimizer
    step (``PER_STEP``), else 1."""
    steps = spec.budget.ppo_epochs * spec.budget.mini_batches
    declared = any(d.get("deviation") in PER_STEP for d in deviations)
    return steps if declared and steps > 1 else 1


def learning_rate(spec: ExperimentSpec, rows: list[dict[str, Any]], steps: int = 1) -> Line:
    """The rate the engine logged for each update (its collected ``rows``) against the spec's
    schedule: ``lr`` is the rate update u ran at, ``lr/next`` the one update u + 1 runs at
    (an engine that logs after stepping its scheduler). With ``steps`` > 1 (``per_step``) the
    schedule is advanced per optimizer step, as declared, and the rate changes within an
    update: ``lr`` is then the rate of the update's last step, ``lr/next`` that of the next
    update's first, so a scheduler a step behind or ahead shows."""
    name = "learning rate"
    total = spec.budget.total_updates
    logged: dict[tuple[str, int], float] = {}
    for row in rows:
        step = int(row.get("step", 0))
        for metric, ahead in (("lr", 0), (NEXT_LR, 1)):
            if step >= 1 and isinstance(row.get(metric), int | float):
                logged[(metric, step + ahead)] = float(row[metric])
    if not logged:
        return Line(name, "not measured", "the engine logged no learning rate")
    order = sorted(logged, key=lambda k: k[1])
    want = {key: lr_within(spec.optim, key[1], total, steps)[-1 if key[0] == "lr" else 0]
            for key in logged}
    off = [key for key in order if not _close(logged[key], want[key])]
    each = ", ".join(f"{logged[k]:.4g} for update {k[1]}" for k in order)
    kind = NEXT_LR if any(k[0] == NEXT_LR for k in logged) else "lr"
    numbers = {"metric": kind, "logged": {k[1]: v for k, v in logged.items()},
               "schedule": {k[1]: v for k, v in want.items()}, "steps_per_update": steps}
    schedule = f"the spec's schedule ({spec.optim.schedule}, warmup {spec.optim.warmup_steps}"
    schedule += (f", advanced per optimizer step, {steps} an update, as the plan declares; "
                 + ("each update's last step" if kind == "lr" else "each update's first step")
                 + ")" if steps > 1 else ")")
    if off:
        metric, update = off[0]
        return Line(name, "FAILED", f"{each} ({kind}); {schedule} gives {want[off[0]]:.4g} for "
                                    f"update {update}, not {logged[off[0]]:.4g}",
                    numbers=numbers)
    return Line(name, "ok", f"{each} ({kind}): {schedule}", numbers=numbers)


def _close(logged: float, want: float) -> bool:
    return abs(logged - want) <= LR_TOLERANCE * max(abs(want), abs(logged)) + 1e-15
