"""An adapter that translates one setting wrongly, but consistently (its launch, its reader and
its stub all agree), passes every check that compares descriptions. Where the engine runs here
the kit watches it instead: each mistake below, applied to the TRL plugin, makes TRL's own
GRPOTrainer do something the spec did not ask, and the kit's engine run names it."""

from __future__ import annotations

import pytest
from kit_runs import assert_one_check, run_kit, trl_module
from optional_installs import TRL_PLUGIN_MISSING

from stateset_backend.translate.rules import Pinned, RuleSet

TRLAdapter = pytest.importorskip("stateset_trl_engine.plugin",
                                 reason=TRL_PLUGIN_MISSING).TRLAdapter

VERSION = "1.16.0"  # the TRL the plugin pins

pytestmark = pytest.mark.slow


class WarmupOffByOne(TRLAdapter):
    """Counts the warm-up from 1: one update more of warm-up than the spec asks."""

    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect),
                "optim.warmup_steps": lambda v, s: Pinned({f.warmup_steps: v + 1})}


class CosineWithoutItsFloor(TRLAdapter):
    """Takes TRL's plain cosine, which decays to 0, not to min_lr_ratio * lr."""

    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect),
                "optim.schedule": lambda v, s: Pinned({f.lr_scheduler_type: v}),
                "optim.min_lr_ratio": lambda v, s: Pinned({f.lr_scheduler_kwargs: {}})}


class BatchInPrompts(TRLAdapter):
    """Gives TRL's batch size in prompts, where TRL counts completions."""

    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        def batch(value, spec):
            return Pinned({f.per_device_train_batch_size: spec.budget.prompts_per_update,
                           f.steps_per_generation: 1, f.gradient_accumulation_steps: 1})

        return {**super().rules(dialect), "budget.prompts_per_update": batch,
                "budget.mini_batches": batch}


class HalfTheGroup(TRLAdapter):
    """Samples half the spec's completions per prompt (and twice the prompts)."""

    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect),
                "algorithm.group_size": lambda v, s: Pinned({f.num_generations: v // 2})}


class SavesAtTwiceThePeriod(TRLAdapter):
    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect), "checkpoint.every": lambda v, s: Pinned(
            {f.save_strategy: "steps", f.save_steps: 2 * v} if v else
            {f.save_strategy: "no", f.save_steps: 500})}


class ValidatesOneLate(TRLAdapter):
    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect), "evaluation.every": lambda v, s: Pinned(
            {f.eval_strategy: "no", "launch.validation.every": v and v + 1})}


class LongerCompletions(TRLAdapter):
    """Lets completions run twice the spec's token limit."""

    def rules(self, dialect) -> RuleSet:
        f = self.keys(dialect)
        return {**super().rules(dialect),
                "data.max_response_tokens": lambda v, s: Pinned({f.max_completion_length: 2 * v})}


@pytest.mark.parametrize("cls, check, says", [
    (WarmupOffByOne, "learning rate", "gives 0.0003333 for update 1, not 0.0006667"),
    (CosineWithoutItsFloor, "learning rate", "gives 0.000775 for update 3, not 0.00075"),
    # TRL itself refuses a generation batch of 3 prompts' completions for groups of 4
    (BatchInPrompts, "launch", "must be divisible by num_generations"),
    (HalfTheGroup, "reward calls", "no multiple of group_size 4"),
    (SavesAtTwiceThePeriod, "checkpoints", "so one of update 3"),
    (ValidatesOneLate, "validation", "the spec asks for every 2 (after updates 2, 4)"),
    (LongerCompletions, "reward calls", "data.max_response_tokens is 4"),
    (TRLAdapter, None, None)])
def test_the_engine_run_catches_a_consistent_mistake(tmp_path, cls, check, says):
    report = run_kit(tmp_path, trl_module("test_kit_watches_the_engine", VERSION), cls,
                     "::TestMistake", "engine_runs")
    assert_one_check(report, says and f"{check}: ", "engine_runs")
    assert_one_check(report, says, "engine_runs")
