"""What a rehearsal reads from the calls an engine makes to the hub's reward shim and from the
learning rate it logs: each way an engine can do other than the spec asks is one FAILED line
that says what it did and what was asked; the recorder itself is the code the shim runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stateset_backend.native.reward import load_reward
from stateset_backend.runs.rehearsal import watch
from stateset_backend.runs.rehearsal.verdict import retained
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.inputs import REWARD_CALLS_ENV, reward_shim
from stateset_backend.spec.schedule import lr_at, lr_within

REWARD = "def score(prompt, response, answer):\n    return float(answer in response)\n"
TRAIN = [f"ticket {i} action :" for i in range(8)]
VALIDATION = [f"question {i} action :" for i in range(3)]
TEST = [f"held out {i} action :" for i in range(3)]


def _spec(root: Path, **over):
    import hashlib

    (root / "data").mkdir(parents=True, exist_ok=True)
    sums = {}
    for name, prompts in (("train", TRAIN), ("validation", VALIDATION), ("test", TEST)):
        path = root / "data" / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": p, "answer": "billing"}) + "\n"
                                for p in prompts))
        sums[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    (root / "reward.py").write_text(REWARD)
    doc = {"name": "watched", "seed": 1,
           "algorithm": {"objective": "grpo", "group_size": 2, "kl": None},
           "model": {"path": "builtin:tiny-llama-support"},
           "data": {**{n: {"uri": f"data/{n}.jsonl", "sha256": sums[n]} for n in sums},
                    "max_response_tokens": 3},
           "reward": {"kind": "python", "entrypoint": "reward.py:score",
                      "sha256": hashlib.sha256(REWARD.encode()).hexdigest()},
           "optim": {"lr": 1e-3, "schedule": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1},
           "budget": {"total_updates": 2, "prompts_per_update": 2},
           "evaluation": {"every": 1}}
    for path, value in over.items():
        node = doc
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_spec(doc)


def _write(run_dir: Path, calls: list[tuple[str, str]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / watch.CALLS_FILE, "w", encoding="utf-8") as out:
        for prompt, response in calls:
            out.write(json.dumps({"prompt": prompt, "response": response,
                                  "answer": "billing", "score": "0.0", "pid": 1}) + "\n")


def _update(prompts: list[str], group: int = 2, response: str = "billing") -> list[tuple]:
    return [(p, response) for p in prompts for _ in range(group)]


def _validate() -> list[tuple]:
    return [(p, "billing") for p in VALIDATION]


def _lines(tmp_path, calls, **over):
    spec = _spec(tmp_path, **over)
    _write(tmp_path / "run", calls)
    train, validation = watch.reward_calls(spec, tmp_path, tmp_path / "run", 2,
                                           lambda text: len(text.split()), launched=True)
    return train, validation


HEALTHY = [*_validate(), *_update(TRAIN[:2]), *_validate(), *_update(TRAIN[2:4]), *_validate()]


def test_an_engine_that_does_what_the_spec_asks_passes(tmp_path):
    train, validation = _lines(tmp_path, HEALTHY)
    assert train.state == "ok", train
    assert "8 train completions scored, as the spec asks (2 updates x 2 prompts x 2 " \
           "completions); the longest completion 1 tokens (limit 3)" in train.detail
    assert validation.state == "ok", validation
    assert validation.detail == ("after updates 1, 2, as the spec asks (and before update 1); "
                                 "3 completions a pass")
    last = [*_update(TRAIN[:2]), *_update(TRAIN[2:4]), *_validate()]
    _, validation = _lines(tmp_path, last, **{"evaluation.every": 3})
    assert validation.detail == ("none due in 2 updates at every 3, as the spec asks (and "
                                 "after update 2); 3 completions a pass"), validation


@pytest.mark.parametrize("calls, says", [
    ([*_update(TRAIN[:2])], "the engine scored 4 train completions; the spec asks for 8 "
                            "(2 updates x 2 prompts x 2 completions)"),
    ([*_update(TRAIN[:4], group=3)], "the engine scored 12 train completions"),
    ([*_update(TRAIN[:2]), *_update(TRAIN[2:5], group=1), (TRAIN[5], "x")],
     "prompts were scored a number of times that is no multiple of group_size 2"),
    ([*_update(TRAIN[:4], response="a b c d")],
     "but a completion of 4 tokens reached the reward: data.max_response_tokens is 3"),
    ([*_update(TRAIN[:4]), (TEST[0], "x")], "1 on the test split, which only `evaluate` may "
                                            "score"),
    ([*_update(TRAIN[:4]), ("a prompt of no split", "x")],
     "1 on prompts in none of the spec's splits"),
])
def test_each_way_of_scoring_other_than_asked_fails(tmp_path, calls, says):
    train, _ = _lines(tmp_path, calls)
    assert train.state == "FAILED" and says in train.detail, train


def test_a_chat_template_around_the_prompt_still_names_its_split(tmp_path):
    wrapped = [(f"<|user|> {p} <|assistant|>", r) for p, r in HEALTHY]
    train, validation = _lines(tmp_path, wrapped)
    assert train.state == validation.state == "ok", (train, validation)


@pytest.mark.parametrize("calls, over, says", [
    ([*_update(TRAIN[:2]), *_update(TRAIN[2:4]), *_validate()], {},
     "the engine validated after update 2; the spec asks for every 1 (after updates 1, 2)"),
    (HEALTHY, {"evaluation.every": None},
     "the spec asks for no validation, but the engine scored the validation split after "
     "updates 0, 1, 2"),
    ([*_update(TRAIN[:2]), *_validate()[:2], *_update(TRAIN[2:4]), *_validate()], {},
     "the pass after update 1 scored 2 completions; the validation split's 3 prompts x "
     "evaluation.samples 1 is 3"),
])
def test_validation_at_other_updates_or_of_another_size_fails(tmp_path, calls, over, says):
    _, validation = _lines(tmp_path, calls, **over)
    assert validation.state == "FAILED" and says in validation.detail, validation


def test_an_engine_that_never_calls_the_shim_fails(tmp_path):
    spec = _spec(tmp_path)
    (tmp_path / "run").mkdir()
    train, validation = watch.reward_calls(spec, tmp_path, tmp_path / "run", 2, None, True)
    assert train.state == "FAILED" and "never called the hub's reward shim" in train.detail
    assert validation.state == "not measured"


def test_the_learning_rate_is_held_to_the_schedule(tmp_path):
    spec = _spec(tmp_path, **{"budget.total_updates": 3})
    right = [{"step": u, "lr": lr_at(spec.optim, u, 3)} for u in (1, 2, 3)]
    assert [r["lr"] for r in right] == pytest.approx([0.0, 1e-3, 5.5e-4])
    assert watch.learning_rate(spec, right).state == "ok"
    # the rate a step ahead under the name of the rate an update ran at: verl's engine
    # workers log after stepping the scheduler
    early = [{"step": u, "lr": lr_at(spec.optim, u + 1, 3)} for u in (1, 2, 3)]
    line = watch.learning_rate(spec, early)
    assert line.state == "FAILED"
    assert "gives 0 for update 1, not 0.001" in line.detail, line
    # the same values collected as what they are pass
    ahead = [{"step": u, "lr/next": lr_at(spec.optim, u + 1, 3)} for u in (1, 2, 3)]
    line = watch.learning_rate(spec, ahead)
    assert line.state == "ok" and "(lr/next)" in line.detail, line
    assert watch.learning_rate(spec, [{"step": 1}]).state == "not measured"


def test_a_schedule_declared_per_optimizer_step_is_held_to_its_steps(tmp_path):
    """An engine whose scheduler steps with its optimizer (TRL, OpenRLHF) declares it; its
    logged rates are then those of one and the same step of each update, not any other."""
    spec = _spec(tmp_path, **{"budget.total_updates": 3, "budget.prompts_per_update": 2,
                              "budget.mini_batches": 2})
    declared = [{"setting": "optim.warmup_steps", "deviation": "lr_warmup_per_optimizer_step"}]
    assert watch.per_step(spec, declared) == 2 and watch.per_step(spec, []) == 1
    # another deviation on the warmup (NeMo RL's start factor) is no per-step scheduler
    other = [{"setting": "optim.warmup_steps", "deviation": "warmup_start_factor"}]
    assert watch.per_step(spec, other) == 1
    # warmup 1 update is 2 steps (0, 0.5); then cosine over the 4 steps left
    assert lr_within(spec.optim, 1, 3, 2) == pytest.approx([0.0, 5e-4])
    last = [{"step": u, "lr": lr_within(spec.optim, u, 3, 2)[-1]} for u in (1, 2, 3)]
    line = watch.learning_rate(spec, last, 2)
    assert line.state == "ok" and "each update's last step" in line.detail, line
    # the same rates held to the per-update schedule fail: the deviation must be declared
    assert watch.learning_rate(spec, last, 1).state == "FAILED"
    # a scheduler a step behind logs each update's first step's rate: a rate of the right
    # update, but not the one the canonical lr names
    behind = [{"step": u, "lr": lr_within(spec.optim, u, 3, 2)[0]} for u in (1, 2, 3)]
    line = watch.learning_rate(spec, behind, 2)
    assert line.state == "FAILED" and "last step) gives 0.0005 for update 1, not 0" in \
        line.detail, line
    # lr/next: the next update's first step
    ahead = [{"step": u, "lr/next": lr_within(spec.optim, u + 1, 3, 2)[0]} for u in (1, 2)]
    assert watch.learning_rate(spec, ahead, 2).state == "ok"


def test_checkpoint_retention_keeps_the_newest_and_the_best_validated(tmp_path):
    """What is left once every checkpoint was saved: the newest ``keep`` and the best by
    select_by among the checkpointed, validated updates (the earlier on a tie), by the values
    the engine logged; every one where keep is null."""
    spec = _spec(tmp_path, **{"checkpoint.keep": 2, "evaluation.every": 1,
                              "evaluation.select_by": "val/reward/mean"})
    rows = [{"step": 1, "val/reward/mean": 0.5}, {"step": 2, "val/reward/mean": 0.5},
            {"step": 3, "val/reward/mean": 0.1}, {"step": 4, "val/reward/mean": 0.2}]
    kept, why = retained(spec, [1, 2, 3, 4], rows)
    assert kept == {1, 3, 4} and "the best by val/reward/mean (update 1, 0.5)" in why
    assert retained(spec, [1, 2, 3, 4], rows[2:])[0] == {3, 4}
    unranked = _spec(tmp_path, **{"checkpoint.keep": 1})
    assert retained(unranked, [2, 4], rows)[0] == {4}
    assert retained(_spec(tmp_path), [2, 4], rows)[0] == {2, 4}


def test_the_shim_and_the_native_engine_record_every_call_one_way(tmp_path):
    spec = _spec(tmp_path)
    shim = tmp_path / "shim.py"
    shim.write_text(reward_shim(spec, str(tmp_path), "test"), encoding="utf-8")
    calls = tmp_path / "calls.jsonl"
    script = (f"import runpy; ns = runpy.run_path({str(shim)!r}); "
              "print(ns['score']('p1', 'billing', 'billing'), "
              "ns['score']('p2', 'no', 'billing'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, REWARD_CALLS_ENV: str(calls)}, check=True)
    assert out.stdout.split() == ["1.0", "0.0"]
    shim_rows = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [(r["prompt"], r["response"], r["score"]) for r in shim_rows] == \
        [("p1", "billing", "1.0"), ("p2", "no", "0.0")]
    calls.unlink()
    os.environ[REWARD_CALLS_ENV] = str(calls)
    try:
        fn = load_reward(spec.reward, tmp_path)
        assert fn("p1", "billing", "billing") == 1.0
    finally:
        del os.environ[REWARD_CALLS_ENV]
    native_rows = [json.loads(line) for line in calls.read_text().splitlines()]
    assert native_rows[0].keys() == shim_rows[0].keys()
    # without the variable nothing is recorded
    calls.unlink()
    assert load_reward(spec.reward, tmp_path)("p", "r", "a") == 0.0
    assert not calls.exists()


def test_a_split_that_cannot_be_read_back_is_not_measured_never_a_crash(tmp_path):
    spec = _spec(tmp_path)
    with open(tmp_path / "data" / "train.jsonl", "a", encoding="utf-8") as out:
        out.write("{not json\n")  # a row the engine skipped
    _write(tmp_path / "run", HEALTHY)
    lines = watch.reward_calls(spec, tmp_path, tmp_path / "run", 2, None, launched=True)
    assert [line.state for line in lines] == ["not measured", "not measured"]
    assert "cannot be read back here" in lines[0].detail


def test_a_checkpoint_retention_removed_is_not_called_missing(tmp_path):
    """An engine that also saves at the last update, keeping 1: the one of the last update the
    spec asks for is gone by design, and the line says so only where retention keeps it."""
    from stateset_backend.runs.rehearsal.verdict import checkpoints
    from stateset_backend.runs.results import ArtifactRecord, Check, Result

    spec = _spec(tmp_path, **{"budget.total_updates": 3, "checkpoint.every": 2,
                              "checkpoint.keep": 1, "evaluation.every": None})

    def left(*steps: int) -> Result:
        return Result.model_construct(checks=[Check(name="artifacts", ok=True, detail="")],
                                      artifacts=[ArtifactRecord(path=f"c{s}/w.pt",
                                                                kind="checkpoint", step=s,
                                                                bytes=1, sha256="0" * 64)
                                                 for s in steps])

    assert checkpoints(spec, left(3), 3, []).state == "ok"
    line = checkpoints(spec, left(2, 3), 3, [])
    assert line.state == "FAILED" and "leaves update 3, not update 2" in line.detail, line
    line = checkpoints(spec, left(), 3, [])
    assert line.state == "FAILED" and "so one of update 2" in line.detail, line


def test_dynamic_sampling_bounds_the_rounds_unless_the_plan_declares_otherwise(tmp_path):
    """Each round draws another batch of groups: the train split may be scored up to
    max_rounds + 1 times the spec's count, and without bound where the plan declares that
    the engine refills until the batch is full (verl 0.9's v1 buffer: unbounded_refill);
    the update a validation pass follows then cannot be told, so the passes are counted."""
    over = {"algorithm.advantage": {"zero_variance_groups": "exclude"},
            "algorithm.dynamic_sampling": {"max_rounds": 1}}
    rounds = [*_validate(), *_update(TRAIN[:2]), *_update(TRAIN[2:4]), *_update(TRAIN[4:6]),
              *_validate(), *_update(TRAIN[6:8]), *_update(TRAIN[:2]), *_update(TRAIN[2:4]),
              *_validate()]
    spec = _spec(tmp_path, **over)
    _write(tmp_path / "run", rounds)

    def lines(deviations=None):
        return watch.reward_calls(spec, tmp_path, tmp_path / "run", 2, None, True, deviations)

    train, validation = lines()
    assert train.state == "FAILED" and "up to 2 rounds of dynamic sampling" in train.detail
    declared = [{"setting": "algorithm.dynamic_sampling.max_rounds",
                 "deviation": "unbounded_refill"}]
    train, validation = lines(declared)
    assert train.state == "ok" and "the plan declares unbounded_refill" in train.detail, train
    assert validation.state == "ok" and "2 passes once training began for 2 asked" in \
        validation.detail, validation
    _write(tmp_path / "run", rounds[:-3])
    _, validation = lines(declared)
    assert validation.state == "FAILED" and "validated 1 times once training began; the " \
        "spec asks for 2" in validation.detail, validation
