"""The kit can fail: a deliberately broken adapter for each check, run through the kit as an
adapter author (or ``stateset-backend conformance``) would, and the check it breaks fails."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from kit_runs import run_kit

from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.conformance.runner import run_module
from stateset_backend.engines.adapter import Checkpoint, Collected, LaunchContext, NativeLaunch
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.modeltree import all_leaf_paths
from stateset_backend.translate.rules import CORE_HANDLED, RuleSet, Translation, carried, refuse


class TranslatesNothing(NativeAdapter):
    def rules(self, dialect):
        return {path: refuse("not implemented") for path in all_leaf_paths(ExperimentSpec)
                if path not in CORE_HANDLED}


class DropsALeaf(NativeAdapter):
    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect), "optim.lr": carried("")}


class Nondeterministic(NativeAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        return NativeLaunch([*launch.argv, f"--nonce={random.random()}"], launch.files)


class WritesIntoTheSpecFolder(NativeAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        Path(ctx.base_dir or ".", "rendered.txt").write_text(str(random.random()))
        return super().render(translation, spec, ctx)


class LetsAnOptionThrough(NativeAdapter):
    """Sets a flag in the argv without listing it among the launch's native keys, and passes
    every ``engine_options`` entry on as a flag after it, the later one winning."""

    def render(self, translation: Translation, spec, ctx) -> NativeLaunch:
        given = spec.engine_options.get(self.name, {})
        own = Translation({k: v for k, v in translation.native.items() if k not in given},
                          translation.sources, translation.rows)
        launch = super().render(own, spec.model_copy(update={"engine_options": {}}), ctx)
        return NativeLaunch([*launch.argv, "--max-steps=3",
                             *(f"{k}={v}" for k, v in given.items())], launch.files)


class IgnoresAnOption(NativeAdapter):
    """Names no free-text option, and plans any unknown ``engine_options`` key by dropping it:
    the engine would never read what the user set."""

    def render(self, translation: Translation, spec, ctx) -> NativeLaunch:
        given = spec.engine_options.get(self.name, {})
        own = Translation({k: v for k, v in translation.native.items() if k not in given},
                          translation.sources, translation.rows)
        return super().render(own, spec.model_copy(update={"engine_options": {}}), ctx)


class PassesUserTextAsSyntax(NativeAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        return NativeLaunch([*launch.argv, "--name", spec.name], launch.files)


class WritesABrokenLauncher(NativeAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        return NativeLaunch(launch.argv, {**launch.files, "launch.py": "def main(:\n"},
                            launch.set_env, launch.env, launch.native)


class DependsOnHashOrder(NativeAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        order = ",".join({"alpha", "beta", "gamma", "delta", "epsilon"})
        return NativeLaunch([*launch.argv, f"--order={order}"], launch.files,
                            launch.set_env, launch.env, launch.native)


class ReportsNaNAsFine(NativeAdapter):
    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.metrics = [{k: v for k, v in row.items()
                        if not (isinstance(v, float) and math.isnan(v))} for row in out.metrics]
        return out


class CountsLogRows(NativeAdapter):
    """committed_updates counting every logged row instead of updates."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.committed_updates = len(out.metrics)
        return out


class UnderCounts(NativeAdapter):
    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.committed_updates = max(0, out.committed_updates - 1)
        return out


class TakesIdentityFromTheLaunch(NativeAdapter):
    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        return out


class TakesIdentityWhenItsFileIsThere(NativeAdapter):
    """Sees that the engine recorded a run, and reports the launch's identity for it."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        if out.run_id is not None:
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        return out


class ListsCheckpointsNewestFirst(NativeAdapter):
    def checkpoints(self, attempt_dir: Path) -> list[Checkpoint]:
        return list(reversed(super().checkpoints(attempt_dir)))


class AcceptsAnyWholeCheckpoint(NativeAdapter):
    """Checks that a checkpoint's files are whole, not whose experiment saved it."""

    def checkpoint_problem(self, checkpoint: Checkpoint, experiment_digest: str) -> str | None:
        manifest = json.loads((checkpoint.path / "manifest.json").read_text())
        return super().checkpoint_problem(checkpoint, manifest["experiment_digest"])


class NamesItsDataFromTheWorkingFolder(NativeAdapter):
    """Tells the engine where its data lives by the folder the plan was made in."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        return dataclasses.replace(launch, files={**launch.files,
                                                  "data_root.txt": os.getcwd()})


class ResumesIntoTheOldAttempt(NativeAdapter):
    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        old = checkpoint.path.parent.parent
        return [a.replace(str(attempt_dir), str(old)) for a in
                super().resume_argv(checkpoint, argv, attempt_dir)]


class StagesTheCheckpointAsALink(NativeAdapter):
    """Stages the checkpoint in the new attempt as a link into the earlier one ("checkpoints
    are large"): the hub refuses an attempt's linked files, so the resumed run ends invalid."""

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        staged = attempt_dir / "staged" / checkpoint.path.name
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.symlink_to(checkpoint.path.resolve(), target_is_directory=True)
        return [*argv, "--resume-from", str(staged)]


class NamedUnlikeItsContract(NativeAdapter):
    name = "native-renamed"


class EscapesInterpolationsOnce(VerlAdapter):
    """Escapes '${' for one OmegaConf resolution, as if verl read its config once: verl
    resolves it in place first, so the escape is gone and the next read resolves."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        from stateset_backend.translate import overrides

        real = overrides.refuse_interpolations
        overrides.refuse_interpolations = lambda *a, **k: None  # type: ignore[assignment]
        try:
            return super().render(translation, spec, ctx)
        finally:
            overrides.refuse_interpolations = real  # type: ignore[assignment]


BROKEN: dict[str, tuple[type[NativeAdapter], str]] = {
    # adapter: (its class, the check it must fail, as `-k` selects it)
    "translates_nothing": (TranslatesNothing, "test_capability"),
    "translates_nothing_determinism": (TranslatesNothing,
                                       "test_translation_is_deterministic_and_pure"),
    "drops_a_leaf": (DropsALeaf, "test_capability and optim"),
    "nondeterministic": (Nondeterministic, "test_translation_is_deterministic_and_pure"),
    "writes_into_the_spec_folder": (WritesIntoTheSpecFolder,
                                    "test_translation_is_deterministic_and_pure"),
    "lets_an_option_through": (LetsAnOptionThrough,
                               "test_engine_options_cannot_reach_owned_keys"),
    "passes_user_text_as_syntax": (PassesUserTextAsSyntax,
                                   "test_hostile_strings_cannot_inject"),
    "ignores_an_option": (IgnoresAnOption, "test_hostile_strings_cannot_inject"),
    "reports_nan_as_fine": (ReportsNaNAsFine, "test_collection and nan_metric"),
    "writes_a_broken_launcher": (WritesABrokenLauncher,
                                 "test_translation_is_deterministic_and_pure"),
    "depends_on_hash_order": (DependsOnHashOrder, "test_plans_agree_across_processes"),
    "counts_log_rows": (CountsLogRows, "test_collection and two_rows_at_one_update"),
    "under_counts": (UnderCounts, "test_collection and healthy"),
    "takes_identity_from_the_launch": (TakesIdentityFromTheLaunch,
                                       "test_collection and missing_identity"),
    "resumes_into_the_old_attempt": (ResumesIntoTheOldAttempt, "test_resume"),
    "takes_identity_when_its_file_is_there": (TakesIdentityWhenItsFileIsThere,
                                              "test_collection and foreign_identity"),
    "lists_checkpoints_newest_first": (ListsCheckpointsNewestFirst, "test_resume"),
    "stages_the_checkpoint_as_a_link": (StagesTheCheckpointAsALink, "test_resume"),
    "accepts_any_whole_checkpoint": (AcceptsAnyWholeCheckpoint, "test_resume"),
    "names_its_data_from_the_working_folder": (NamesItsDataFromTheWorkingFolder,
                                               "test_translation_is_deterministic_and_pure"),
    "named_unlike_its_contract": (NamedUnlikeItsContract,
                                  "test_contract_matches_the_shipped_schema"),
}

MODULE = '''
import pytest
from test_conformance_kit import TestNativeConformance
from test_conformance_kit_fails import {cls}


class TestBroken(TestNativeConformance):
    @pytest.fixture
    def adapter(self):
        return {cls}()
'''


def _run(tmp_path: Path, cls: type, selection: str) -> dict[str, Any]:
    # one module name per class: pytest runs in this process, where module names are shared
    module = tmp_path / f"test_broken_{cls.__name__.lower()}.py"
    module.write_text(MODULE.format(cls=cls.__name__), encoding="utf-8")
    here = str(Path(__file__).parent)
    return run_module(module, "::TestBroken", ["-k", selection, "--import-mode=importlib",
                                               "-o", f"pythonpath={here}"])


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_the_kit_fails_a_broken_adapter(broken, tmp_path):
    cls, selection = BROKEN[broken]
    report = _run(tmp_path, cls, selection)
    failed = [c for c in report["checks"] if c["state"] == "failed"]
    assert failed, f"{broken}: the kit passed {report['counts']}"
    assert all(c["reason"] for c in failed)


class SetsAMisspeltKey(VerlAdapter):
    """Pins a setting to a key no verl release has (clip_ratio_hgih)."""

    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import to

        return {**super().rules(dialect),
                "algorithm.clip.high": to("actor_rollout_ref.actor.clip_ratio_hgih")}


class AlsoSetsAMisspeltKey(VerlAdapter):
    """Sets a key no verl release has beside the right one (ppo_epoch)."""

    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import to

        return {**super().rules(dialect), "budget.ppo_epochs": to(
            "actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.ppo_epoch")}


class DropsAKeyFromTheArgv(VerlAdapter):
    """Lists a key as set, but the argv never carries it."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        dropped = "actor_rollout_ref.actor.clip_ratio_low="
        argv = [a for a in launch.argv if not a.startswith(dropped)]
        return NativeLaunch(argv, launch.files, launch.set_env, launch.env, launch.native)


class RendersAnotherValue(VerlAdapter):
    """Declares one learning rate and launches another."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        argv = [a.replace("actor_rollout_ref.actor.optim.lr=", "actor_rollout_ref.actor.optim.lr=9")
                if a.startswith("actor_rollout_ref.actor.optim.lr=") else a for a in launch.argv]
        return NativeLaunch(argv, launch.files, launch.set_env, launch.env, launch.native)


class LaunchesGrpoForRloo(VerlAdapter):
    """Claims rloo, but its launch runs verl's grpo estimator."""

    def rules(self, dialect) -> RuleSet:
        rules = dict(super().rules(dialect))
        real = rules["algorithm.objective"]

        def objective(value, spec):
            return real("grpo" if value == "rloo" else value, spec)

        return {**rules, "algorithm.objective": objective}


class PinsAConstant(VerlAdapter):
    """Claims to pin weight decay, but always launches verl's default."""

    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import Pinned

        return {**super().rules(dialect), "optim.weight_decay": lambda v, s: Pinned(
            {"actor_rollout_ref.actor.optim.weight_decay": 0.01,
             "critic.optim.weight_decay": 0.01})}


class ResponseLimitIncludesThePrompt(VerlAdapter):
    """Sets max_response_length to prompt + response tokens."""

    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import Pinned

        return {**super().rules(dialect), "data.max_response_tokens": lambda v, s: Pinned(
            {"data.max_response_length": v + s.data.max_prompt_tokens})}


class SwapsTheClipPair(VerlAdapter):
    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import to

        return {**super().rules(dialect),
                "algorithm.clip.low": to("actor_rollout_ref.actor.clip_ratio_high"),
                "algorithm.clip.high": to("actor_rollout_ref.actor.clip_ratio_low")}


class CountsMiniBatchesInResponses(VerlAdapter):
    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import Pinned

        return {**super().rules(dialect), "budget.mini_batches": lambda v, s: Pinned(
            {"actor_rollout_ref.actor.ppo_mini_batch_size":
             s.budget.prompts_per_update * s.algorithm.group_size // v})}


class SwapsK1AndK3(VerlAdapter):
    def rules(self, dialect) -> RuleSet:
        from stateset_backend.translate.rules import Pinned

        names = {"k1": "low_var_kl", "k2": "mse", "k3": "kl"}

        def estimator(value, spec):
            key = "actor_rollout_ref.actor.kl_loss_type" if spec.algorithm.kl.placement == \
                "loss" else "algorithm.kl_penalty"
            return Pinned({key: names[value]})

        return {**super().rules(dialect), "algorithm.kl.estimator": estimator}


class ShimSwapsResponseAndAnswer(VerlAdapter):
    """The reward shim hands the user's score() verl's arguments in the wrong order."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        files = {name: text.replace("score(prompt, solution_str, ground_truth)",
                                    "score(prompt, ground_truth, solution_str)")
                 for name, text in launch.files.items()}
        assert files != launch.files
        return NativeLaunch(launch.argv, files, launch.set_env)


class LaunchesAnotherEntryPoint(VerlAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        argv = [a.replace("verl.trainer.main_ppo", "verl.trainer.main") for a in launch.argv]
        return NativeLaunch(argv, launch.files, launch.set_env)


class NeverRunsTheClampDeviation(VerlAdapter):
    """verl clamps k3 at 10 whatever the spec asks; this adapter says verl honours any clamp
    on its own."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "algorithm.kl.clamp": carried("verl's k3 estimator clamps as asked")}


VERL_MODULE = '''
import pytest
from test_conformance_kit import TestVerlConformance
from test_conformance_kit_fails import {cls}


class TestBroken(TestVerlConformance):
    engine_versions = ["{version}"]

    @pytest.fixture
    def adapter(self):
        return {cls}()
'''


def _kit_on_verl(tmp_path: Path, cls: type, selection: str, says: str | None,
                 checks: int = 1, version: str = "0.9.1") -> None:
    """The kit's selected checks on verl ``version`` with ``cls`` as the adapter: a failure
    whose reason holds ``says``, or (``says`` None) ``checks`` passes and no failure."""
    pytest.importorskip("hydra")
    report = run_kit(tmp_path, VERL_MODULE.replace("{version}", version), cls, "::TestBroken",
                     selection)
    failed = [c for c in report["checks"] if c["state"] == "failed"]
    if says is None:
        assert not failed and report["counts"]["passed"] == checks, report["checks"]
    else:
        assert any(says in c["reason"] for c in failed), report["checks"]


@pytest.mark.parametrize("cls, fails", [(EscapesInterpolationsOnce, True),
                                        (VerlAdapter, False)])
def test_the_kit_reads_verl_launches_as_verl_does(tmp_path, cls, fails):
    """The hostile-string check reads verl's launch through verl's whole read path (the
    in-place resolve included): an escape good for one resolution leaks the probe secret."""
    _kit_on_verl(tmp_path, cls, "test_hostile_strings_cannot_inject",
                 "STATESET_PROBE" if fails else None)


@pytest.mark.parametrize("cls, says", [
    # the release's default for the key it should have set is left unpinned: every sample
    # is refused, and the one failure says why
    (SetsAMisspeltKey, "leaves actor_rollout_ref.actor.clip_ratio_high at the verl"),
    (AlsoSetsAMisspeltKey, "actor_rollout_ref.actor.ppo_epoch: verl 0.9.1 has no such key"),
    (DropsAKeyFromTheArgv, "actor_rollout_ref.actor.clip_ratio_low: the launch lists it as set"),
    (RendersAnotherValue, "actor_rollout_ref.actor.optim.lr: verl 0.9.1 reads 9"),
    (VerlAdapter, None)])
def test_the_kit_reads_the_launch_against_the_release(tmp_path, cls, says):
    _kit_on_verl(tmp_path, cls, "test_launch_reads_back_as_declared", says)


@pytest.mark.parametrize("cls, says", [
    (LaunchesGrpoForRloo, "algorithm.adv_estimator: verl 0.9.1 reads 'grpo', but for this spec it "
                          "must read ('rloo',)"),
    (PinsAConstant, "optim.weight_decay = 0.005: actor_rollout_ref.actor.optim.weight_decay"),
    (ResponseLimitIncludesThePrompt, "data.max_response_length: verl 0.9.1 reads"),
    (SwapsTheClipPair, "actor_rollout_ref.actor.clip_ratio_"),
    (CountsMiniBatchesInResponses, "actor_rollout_ref.actor.ppo_mini_batch_size: verl"),
    (SwapsK1AndK3, "algorithm.kl_penalty: verl 0.9.1 reads 'low_var_kl', but for this spec"),
    (VerlAdapter, None)])
def test_the_kit_varies_each_setting(tmp_path, cls, says):
    _kit_on_verl(tmp_path, cls, "test_each_setting_reaches_its_claimed or "
                 "test_launch_reads_back_as_declared", says, checks=2)



class SizesTheTokenBudgetFromTheResponse(VerlAdapter):
    """Sizes verl's token budget from the response limit alone, as if the prompt were not in
    the sequence: the right budget while both limits sum under verl's 16384 floor."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        budget = {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu":
                  max(16384, 2 * spec.data.max_response_tokens)}
        return super().render(Translation({**translation.native, **budget},
                                          translation.sources, translation.rows), spec, ctx)


@pytest.mark.parametrize("cls, says", [
    (SizesTheTokenBudgetFromTheResponse, "limits past 16K tokens: actor_rollout_ref.actor."
                                         "ppo_max_token_len_per_gpu: verl 0.9.1 reads 16384"),
    (VerlAdapter, None)])
def test_the_kit_reads_launches_at_awkward_numbers(tmp_path, cls, says):
    """A rule that is right only at round numbers passes every claimed sample and fails at
    the awkward ones."""
    pytest.importorskip("hydra")
    report = run_kit(tmp_path, VERL_MODULE.replace("{version}", "0.9.1"), cls, "::TestBroken",
                     "test_launch_reads_back_at_awkward or test_launch_reads_back_as_declared")
    states = {c["check"]: (c["state"], c["reason"]) for c in report["checks"]}
    assert states["launch_reads_back_as_declared"][0] == "passed", states
    awkward = states["launch_reads_back_at_awkward_numbers"]
    assert awkward[0] == "passed" if says is None else says in awkward[1], states

class ClaimsGspoForEveryRelease(VerlAdapter):
    """Claims GSPO (and its sequence-level ratio) from verl's first release on: 0.5.0's
    config takes ``loss_mode=gspo`` without a word, and its loss registry has no such loss."""

    @property
    def contract(self):
        real = super().contract
        doc = real.to_json()
        moved = ("objective:gspo", "ratio:sequence")
        for claim in doc["capabilities"]:
            claim["provides"] = [c for c in claim["provides"] if c not in moved]
        doc["capabilities"][0]["provides"] += moved
        return type(real).model_validate(doc)


@pytest.mark.parametrize("cls, version, says", [
    (ClaimsGspoForEveryRelease, "0.5.0",
     "actor_rollout_ref.actor.policy_loss.loss_mode = 'gspo': verl 0.5.0 implements only"),
    (ClaimsGspoForEveryRelease, "0.6.0", None),
    (VerlAdapter, "0.5.0", None)])
def test_the_kit_holds_values_to_the_release_that_implements_them(tmp_path, cls, version,
                                                                  says):
    """Each string value a launch sets is one the release's own code implements (the domains
    generated from its registries and dispatch), so a capability claimed for a release that
    lacks the value fails, where verl's config would take it and fail on the GPU."""
    _kit_on_verl(tmp_path, cls, "test_launch_reads_back_as_declared", says, version=version)


class StatesAnotherClamp(VerlAdapter):
    """Declares verl's k3 clamp at 20 (the log-ratio's clamp), where the estimate's is 10."""

    @property
    def contract(self):
        real = super().contract
        doc = real.to_json()
        for dialect in doc["dialects"]:
            if "k3_clamp" in dialect.get("deviations", {}):
                dialect["deviations"]["k3_clamp"]["engine_value"] = 20.0
        return type(real).model_validate(doc)


class StatesAnotherEpsilon(VerlAdapter):
    """States the whitening constant as 1e-6 (verl's GRPO group epsilon) in words."""

    @property
    def contract(self):
        real = super().contract
        doc = real.to_json()
        for dialect in doc["dialects"]:
            if "whitening_epsilon" in dialect.get("deviations", {}):
                dialect["deviations"]["whitening_epsilon"]["quantity"] = 1e-6
        return type(real).model_validate(doc)


@pytest.mark.parametrize("cls, version, says", [
    (StatesAnotherClamp, "0.9.1", "deviation 'k3_clamp' states 20 (algorithm.kl.clamp), but "
                                  "verl 0.9.1's own code gives 10"),
    (StatesAnotherEpsilon, "0.4.1", "deviation 'whitening_epsilon' states 1e-06"),
    (VerlAdapter, "0.4.1", None)])
def test_the_kit_holds_stated_numbers_to_the_releases_code(tmp_path, cls, version, says):
    """A deviation's number is measured from the release itself (its own functions run from
    its source when the surface is generated): a wrong one fails, where before it was held
    only to the contract that states it."""
    _kit_on_verl(tmp_path, cls, "test_declared_quantities", says, version=version)


def test_a_stated_number_nothing_measures_is_named_not_passed():
    from stateset_backend.conformance.quantities import check_quantities
    from stateset_backend.contracts.loader import Deviation

    stated = {"eps": Deviation(setting="algorithm.advantage.epsilon", engine_value=1e-4,
                               description="adds 1e-4 to the std"),
              "words": Deviation(setting="optim.lr", engine_value="lr * 0.5",
                                 description="halves the rate", quantity=0.5),
              "prose": Deviation(setting="data.shuffle", engine_value="unseeded",
                                 description="no number stated")}
    checked, missing = check_quantities(stated, {"half": {"value": 0.5, "how": "x"}},
                                        {"words": "half"}, "echo 1.0", AssertionError)
    assert checked == ["words"] and missing == ["eps"]
    with pytest.raises(AssertionError, match=r"quantities\['half'\] is 0.5: give"):
        check_quantities(stated, {"half": 0.5}, {"words": "half"}, "echo 1.0",
                         AssertionError)


DEVIATIONS, STUB = "test_declared_deviations_run", "test_launch_runs_under_an_engine_stub"


@pytest.mark.parametrize("cls, selection, says", [
    # every declared deviation runs in some sample
    (NeverRunsTheClampDeviation, DEVIATIONS, "declares deviations that no sample runs: "
                                             "'k3_clamp' on algorithm.kl.clamp (tried "),
    (VerlAdapter, DEVIATIONS, None),
    # the launch runs under a stub of verl's entry point, its reward answering verl's call
    (ShimSwapsResponseAndAnswer, STUB, "scores the kit's cases [0.0, 0.0], but the spec's "
                                       "reward"),
    (LaunchesAnotherEntryPoint, STUB, "does not reach the engine's entry point"),
    (VerlAdapter, STUB, None)])
def test_the_kit_runs_deviations_and_launches(tmp_path, cls, selection, says):
    _kit_on_verl(tmp_path, cls, selection, says)


def test_the_same_selection_passes_on_the_real_adapter(tmp_path):
    """The broken adapters fail because of their defect, not because of the selection."""
    for broken in ("nondeterministic", "reports_nan_as_fine", "resumes_into_the_old_attempt",
                   "lets_an_option_through"):
        _, selection = BROKEN[broken]
        report = _run(tmp_path, NativeAdapter, selection)
        assert report["counts"]["failed"] == 0, report["checks"]
        assert report["counts"]["passed"] > 0


def test_an_unclaimed_capability_that_plans_fails_the_kit(tmp_path, monkeypatch):
    """An adapter whose contract check is bypassed (it plans what it does not claim) fails."""
    from stateset_backend.conformance import checks
    from stateset_backend.conformance.samples import write_sample_files
    from stateset_backend.plan import launch_plan as plan_module

    files = write_sample_files(tmp_path)
    monkeypatch.setattr(plan_module, "check", lambda *a: _Passing())
    with pytest.raises(checks.CheckFailed, match="not claimed"):
        checks.check_capability(NativeAdapter(), "0.1.0", "rollout:vllm", files,
                                {"model": {"path": "builtin:tiny-llama-support"},
                                 "data": {"chat_template": False}})


class _Passing:
    def raise_if_missing(self) -> None:
        return None


def test_a_declared_gap_is_unsupported_not_passed(tmp_path):
    module = tmp_path / "test_declared.py"
    module.write_text(MODULE.format(cls="NativeAdapter").replace(
        "from test_conformance_kit_fails import NativeAdapter",
        "from stateset_backend.adapters.native.adapter import NativeAdapter") +
        '    unsupported = {"lora": "not yet"}\n', encoding="utf-8")
    here = str(Path(__file__).parent)
    report = run_module(module, "::TestBroken", ["-k", "test_capability and lora",
                                                 "--import-mode=importlib",
                                                 "-o", f"pythonpath={here}"])
    assert report["counts"]["unsupported"] == 1 and report["counts"]["passed"] == 0, report
    (check,) = report["checks"]
    assert check["reason"] == "lora: not yet"


def test_context_is_what_the_writer_receives():
    """LaunchContext is the writer's input: run name carries run id and digest."""
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "1" * 64, "0.1.0",
                        NativeAdapter().contract.dialects[0])
    assert ctx.run_id in ctx.run_name and "1" * 64 in ctx.run_name


@pytest.mark.parametrize("script, says", [
    ("print('starting', {name!r})", None),
    ("print('starting', '{name}')", "hostile values changed the program"),
    ("echo starting {quoted}", None),
    ("echo \"starting {name}\"", "unquoted, where a shell reads it as code")])
def test_a_user_string_in_a_launchs_code_stays_data(script, says):
    """Python's -c script keeps a user string a literal (repr), a shell's quotes it as
    shlex.quote does; written in otherwise, the text is code."""
    import shlex

    from stateset_backend.conformance.checks.injection import (
        CheckFailed,
        check_no_script_holds_text,
    )
    from stateset_backend.plan.launch_plan import LaunchPlan

    def plan(name: str) -> LaunchPlan:
        program = "{python}" if script.startswith("print") else "/bin/sh"
        code = script.format(name=name, quoted=shlex.quote(name))
        return LaunchPlan.model_construct(argv=[program, "-c", code], files={})

    hostile = "a'b $(touch x)"
    if says is None:
        check_no_script_holds_text(plan("benign"), plan(hostile), {"name": hostile})
    else:
        with pytest.raises(CheckFailed, match=re.escape(says)):
            check_no_script_holds_text(plan("benign"), plan(hostile), {"name": hostile})


class ResumesWithTheBatchLeft(VerlAdapter):
    """A resume that halves the train batch, as if to finish within the time left."""

    def resume_argv(self, checkpoint, argv, attempt_dir):
        return [f"data.train_batch_size={int(a.split('=', 1)[1]) // 2}"
                if a.startswith("data.train_batch_size=") else a
                for a in super().resume_argv(checkpoint, argv, attempt_dir)]


@pytest.mark.parametrize("cls, says", [
    (ResumesWithTheBatchLeft, "the resumed launch reads data.train_batch_size = "),
    (VerlAdapter, None)])
def test_a_resume_keeps_the_experiment(tmp_path, cls, says):
    """The resumed launch, read as verl reads it, sets every key the spec's settings set as
    the first launch does: a resume changes where verl starts, never the experiment."""
    _kit_on_verl(tmp_path, cls, "test_resume", says)
