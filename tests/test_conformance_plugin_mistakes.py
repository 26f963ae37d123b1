"""The mistakes a plugin author makes who writes an adapter from docs/plugins.md alone, each
applied to the echo example plugin: the kit run on the copy fails, and its message names the
key and what to fix."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from pathlib import Path

import pytest
from kit_runs import assert_one_check, run_kit
from stateset_echo_engine.plugin import EchoAdapter

from stateset_backend.contracts.loader import Contract
from stateset_backend.engines.adapter import Collected, InvalidInput, NativeLaunch
from stateset_backend.translate.rules import Pinned, RuleSet, carried, to


class SetsNothingForALeaf(EchoAdapter):
    """Says it pins the learning rate, but the launch never hands it to the engine."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        settings = json.loads(launch.files["echo.json"])
        settings.pop("optim.lr")
        return NativeLaunch(launch.argv, {"echo.json": json.dumps(settings)}, launch.set_env)


class DropsAFlagFromTheArgv(EchoAdapter):
    """Lists --updates among the launch's keys, but leaves it out of the argv."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        at = launch.argv.index("--updates")
        return NativeLaunch(launch.argv[:at] + launch.argv[at + 2:], launch.files,
                            launch.set_env, native={**translation.native})


class MisspellsAKey(EchoAdapter):
    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect), "algorithm.clip.high": to("algorithm.clip.hgih")}


class PinsAKeyNoEngineReads(EchoAdapter):
    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect), "optim.lr": to("optimizer.learning_rate")}


class WritesALauncherThatIsNotPython(EchoAdapter):
    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        return NativeLaunch(launch.argv, {**launch.files, "launch.py": "def main(:\n"},
                            launch.set_env)


class ClaimsRlooLaunchesGrpo(EchoAdapter):
    """The contract claims objective:rloo; the launch runs GRPO whatever the spec says."""

    @property
    def contract(self) -> Contract:
        doc = super().contract.to_json()
        doc["capabilities"][0]["provides"].append("objective:rloo")
        return Contract.model_validate(doc)

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "algorithm.objective": to("algorithm.objective", convert=lambda v: "grpo")}


class CarriesTheLearningRate(EchoAdapter):
    """Says the engine's own rate already is the spec's, for every rate (and, as an author
    who believed it would, writes no expectation of the rate)."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect), "optim.lr": carried("the engine's own rate")}

    def kit_support(self):
        support = super().kit_support()
        return dataclasses.replace(support, expectations=tuple(
            e for e in support.expectations if e[0] != ("optim.lr",)))


class LeavesTheTemperatureToTheEngine(EchoAdapter):
    """Says the engine's own sampling temperature is the spec's, so the launch never sets
    it and the engine samples at whatever its release defaults to."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "rollout.temperature": carried("the engine samples at the spec's temperature")}


class CountsLogRows(EchoAdapter):
    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.committed_updates = len(out.metrics)
        return out


class CountsUpdatesFromTheLaunch(EchoAdapter):
    """Writes the planned updates into a file of its launch and reports them as committed,
    whatever the engine's log shows."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        planned = json.dumps({"updates": spec.budget.total_updates})
        return NativeLaunch(launch.argv, {**launch.files, "launch.json": planned},
                            launch.set_env)

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        if (attempt_dir / "launch.json").is_file():
            out.committed_updates = json.loads((attempt_dir / "launch.json").read_text())[
                "updates"]
        return out


class ReportsTheScoreInPercent(EchoAdapter):
    """Reads the engine's score as a percentage: every reward a hundred times what it was."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.metrics = [{**r, "reward/mean": 100 * r["reward/mean"]} for r in out.metrics]
        return out


class CarriesTheRateNamingItsRun(CarriesTheLearningRate):
    """CarriesTheLearningRate, with the run's name in the launch's file (as a launch should
    name its run): that name differs in every plan, the rate in none."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        settings = {**json.loads(launch.files["echo.json"]), "run": ctx.run_name}
        return NativeLaunch(launch.argv, {"echo.json": json.dumps(settings)}, launch.set_env)


class ExpectsNothing(EchoAdapter):
    """Names an expectation for every key, each answering "not checked" for every spec."""

    def kit_support(self):
        support = super().kit_support()
        return dataclasses.replace(support, expectations=tuple(
            (spellings, lambda spec: None) for spellings, _ in support.expectations))


class RefusesAModelFolderNotHere(EchoAdapter):
    """Fails fast on a local model folder that does not exist on the planning machine."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        path = Path(spec.model.path)
        if not path.is_absolute() and ctx.base_dir is not None:
            path = Path(ctx.base_dir) / path
        if spec.model.path.startswith("/") and not path.is_dir():
            raise InvalidInput(f"model.path: no model folder at {spec.model.path}")
        return super().render(translation, spec, ctx)


class TrustsTheIdentityFile(EchoAdapter):
    """Sees that the engine wrote its identity file and reports the identity it launched
    with, not the one in the file: another run's outputs read as this run's."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        if (attempt_dir / "identity.json").is_file():
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        return out


class ReadsTheNewestAttemptByName(EchoAdapter):
    """Collects "the run's newest outputs": the attempt folder whose name sorts last as
    text (attempt 9 after attempt 10), not the attempt it was asked about."""

    def collect(self, attempt_dir, ctx) -> Collected:
        found = [p for p in attempt_dir.parent.iterdir() if (p / "log.jsonl").is_file()]
        return super().collect(max(found, key=lambda p: p.name, default=attempt_dir), ctx)


class NamesTheRawMetricWrong(EchoAdapter):
    """Records that the engine logged the reward as "train/reward" (it logs "score")."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        out.raw_metric_names = {"reward/mean": "train/reward"}
        return out


class SeedZeroMeansUnset(EchoAdapter):
    """``seed or DEFAULT``: a spec's seed of 0 launches with seed 42."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        argv = list(launch.argv)
        at = argv.index("--seed") + 1
        argv[at] = str(int(argv[at]) or 42)
        return NativeLaunch(argv, launch.files, launch.set_env)


class WritesTheRateWithThreeDigits(EchoAdapter):
    """Writes the rate as the engine's docs print it (``1.23e-06``)."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "optim.lr": to("optim.lr", convert=lambda v: float(f"{v:.2e}"))}


class TakesTheSeedFromTheEnvironment(EchoAdapter):
    """Lets a sweep override the seed with $ECHO_SEED on the planning machine."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        argv = list(launch.argv)
        at = argv.index("--seed") + 1
        argv[at] = os.environ.get("ECHO_SEED", argv[at])
        return NativeLaunch(argv, launch.files, launch.set_env)


class ReportsTheConfiguredRate(EchoAdapter):
    """The engine logs no learning rate, so the collector reports the launch's configured one
    at every update: under a schedule, the peak rate as every update's."""

    def collect(self, attempt_dir, ctx) -> Collected:
        out = super().collect(attempt_dir, ctx)
        lr = json.loads((attempt_dir / "echo.json").read_text())["optim.lr"]
        out.metrics = [{**r, "lr": lr} for r in out.metrics]
        return out


class RoundsATinyTemperatureToGreedy(EchoAdapter):
    """Sends a temperature under 0.05 as 0 (greedy), as if it were one."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "rollout.temperature": to("rollout.temperature",
                                          convert=lambda v: 0.0 if v < 0.05 else v)}


class AnnouncesTheRunInAShell(EchoAdapter):
    """Wraps the engine in ``sh -c`` to print a banner with the spec's name; the engine's own
    arguments stay elements of their own (``"$@"``)."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        script = f'echo "stateset: starting {spec.name}" >&2; exec "$@"'
        return NativeLaunch(["sh", "-c", script, "sh", *launch.argv], launch.files,
                            launch.set_env)


class AnnouncesTheRunQuoted(EchoAdapter):
    """The same banner with the name quoted as a shell reads it as one word: data."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        script = f"echo stateset: starting {shlex.quote(spec.name)} >&2; exec \"$@\""
        return NativeLaunch(["sh", "-c", script, "sh", *launch.argv], launch.files,
                            launch.set_env)


class FoldsAnOptionsAliasOntoItsKey(EchoAdapter):
    """Folds an engine option given by its short name (``lr``) onto the key it stands for,
    "so the file holds one spelling": an option then overrides the spec's rate."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        settings = json.loads(launch.files["echo.json"])
        if "lr" in settings:
            settings["optim.lr"] = settings.pop("lr")
        return NativeLaunch(launch.argv, {**launch.files, "echo.json": json.dumps(settings)},
                            launch.set_env)


class DeclaresMiniBatchesAnExecutionDefault(EchoAdapter):
    """Declares the mini-batch count an execution default ("micro-batches: memory only"),
    though the spec's budget.mini_batches sets it: an option could change the optimizer steps
    an update takes."""

    @property
    def contract(self) -> Contract:
        doc = super().contract.to_json()
        doc["dialects"][0]["keys"]["execution"] = {"budget.mini_batches": {
            "reason": "micro-batches the update's batch is accumulated in: memory only"}}
        return Contract.model_validate(doc)


class LooksTheBudgetFlagUpByRelease(EchoAdapter):
    """Looks the budget flag up in a table of the releases its author tried (1.2 to 1.4),
    while the contract supports every release from 1.0."""

    FLAGS = {"1.2": "--updates", "1.3": "--updates", "1.4": "--updates"}

    def render(self, translation, spec, ctx) -> NativeLaunch:
        flag = self.FLAGS[".".join(ctx.engine_version.split(".")[:2])]
        launch = super().render(translation, spec, ctx)
        return NativeLaunch([flag if a == "--updates" else a for a in launch.argv],
                            launch.files, launch.set_env)


class WritesCountsAsFloats(EchoAdapter):
    """Writes every number of echo.json as a float ("JSON numbers are doubles"): the engine
    would count 4.0 samples a prompt."""

    def render(self, translation, spec, ctx) -> NativeLaunch:
        launch = super().render(translation, spec, ctx)
        settings = {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                    for k, v in json.loads(launch.files["echo.json"]).items()}
        return NativeLaunch(launch.argv, {**launch.files, "echo.json": json.dumps(settings)},
                            launch.set_env)


class FillsANullDualClip(EchoAdapter):
    """Hands the engine a dual clip of 3 where the spec asks for none ("the engine's config
    types it float, not Optional")."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "algorithm.clip.dual_clip": to("algorithm.clip.dual_clip",
                                               convert=lambda v: 3.0 if v is None else v)}


class HandsTheEngineAnUnreachableDualClip(EchoAdapter):
    """Correct: no dual clip is a bound no ratio reaches, the engine's own "off"."""

    def rules(self, dialect) -> RuleSet:
        return {**super().rules(dialect),
                "algorithm.clip.dual_clip": to("algorithm.clip.dual_clip",
                                               convert=lambda v: 1e9 if v is None else v)}


class LeavesAnUnsetTopKToTheEngine(EchoAdapter):
    """Leaves the top-k key out of the launch where the spec sets none ("null: nothing to
    pass"): the engine then filters at its own default."""

    def rules(self, dialect) -> RuleSet:
        def top_k(value, spec):
            if value is None:
                return Pinned({}, "null: no top-k, nothing to pass")
            return Pinned({"rollout.top_k": value})
        return {**super().rules(dialect), "rollout.top_k": top_k}


MODULE = '''
import pytest
from stateset_backend.conformance import AdapterConformance
from test_conformance_plugin_mistakes import {cls}


class TestMistake(AdapterConformance):
    engine_versions = ["1.2.0"]

    @pytest.fixture
    def adapter(self):
        return {cls}()
'''


@pytest.mark.parametrize("cls, says", [
    (SetsNothingForALeaf, "optim.lr: the launch lists it as set"),
    (DropsAFlagFromTheArgv, "--updates"),
    (MisspellsAKey, "algorithm.clip.hgih: echo 1.2.0 has no such key"),
    (PinsAKeyNoEngineReads, "optimizer.learning_rate: echo 1.2.0 has no such key"),
    (WritesALauncherThatIsNotPython, "launch.py"),
    (ClaimsRlooLaunchesGrpo, "algorithm.objective: echo 1.2.0 reads 'grpo', but for this spec "
                             "it must read 'rloo'"),
    (CountsLogRows, "committed_updates is 5, but the outputs show 4 updates"),
    (CarriesTheLearningRate, "optim.lr: planned at 1e-06 and 5e-07, the launch is the same"),
    (CarriesTheRateNamingItsRun, "optim.lr: planned at 1e-06 and 5e-07, the launch is the "
                                 "same"),
    (CountsUpdatesFromTheLaunch, "stopped_early: the result is succeeded, expected invalid"),
    (ReportsTheScoreInPercent, "healthy: the engine logged reward/mean = 0.2 at update 1, "
                               "and collect reads 20.0"),
    (ExpectsNothing, "nothing the engine reads is held to a value"),
    (RefusesAModelFolderNotHere, "refuse a model path for its text, not for being absent "
                                 "here"),
    (TrustsTheIdentityFile, "foreign_identity: the result is succeeded, expected invalid"),
    (ReadsTheNewestAttemptByName, "healthy: committed_updates is 2, but the outputs show 4 "
                                  "updates"),
    (NamesTheRawMetricWrong, "healthy: collect says it read reward/mean under the engine's "
                             "name 'train/reward', which no file the engine wrote holds"),
    (SeedZeroMeansUnset, "seed 0, numbers of nine digits: seed: echo 1.2.0 reads 42 from the "
                         "launch, which declares 0"),
    (WritesTheRateWithThreeDigits, "seed 0, numbers of nine digits: optim.lr: echo 1.2.0 reads "
                                   "1.23e-06, but for this spec it must read 1.23456789e-06"),
    (AnnouncesTheRunInAShell, "is written into the sh -c script (argv 2) unquoted, where a "
                              "shell reads it as code"),
    (AnnouncesTheRunQuoted, None),
    (RoundsATinyTemperatureToGreedy, "a temperature near greedy: rollout.temperature: echo "
                                     "1.2.0 reads 0.0, but for this spec it must read 0.01"),
    (ReportsTheConfiguredRate, "healthy: collect reports lr = 1e-06 at update 1, where the "
                               "engine logged no lr"),
    (TakesTheSeedFromTheEnvironment, "the plan changes with $ECHO_SEED on the planning "
                                     "machine"),
    (FoldsAnOptionsAliasOntoItsKey, "engine_options 'lr': 0.250003 planned, and the engine "
                                    "then reads optim.lr = 0.250003, which the spec pins at "
                                    "1e-06"),
    (DeclaresMiniBatchesAnExecutionDefault, "budget.mini_batches: declared an execution "
                                            "default, but the translation sets it from a "
                                            "setting of the experiment"),
    (LooksTheBudgetFlagUpByRelease, "echo 1.0, which the contract's supported range '>=1.0' "
                                    "admits: planning the base sample raised AdapterBug"),
    (WritesCountsAsFloats, "algorithm.group_size: echo 1.2.0 reads 4.0, a float, where it "
                           "takes the whole number 4"),
    (FillsANullDualClip, "algorithm.clip.dual_clip: planned unset (null) and at 3.0, the "
                         "launch is the same"),
    (LeavesAnUnsetTopKToTheEngine, "rollout.top_k: unset (null), the launch leaves "
                                   "rollout.top_k to the release's default"),
    (HandsTheEngineAnUnreachableDualClip, None),
    (EchoAdapter, None)])
def test_a_docs_only_plugin_authors_mistake_fails_the_kit(tmp_path, cls, says):
    report = run_kit(tmp_path, MODULE, cls, "::TestMistake",
                     "not plans_agree_across_processes")
    failed = [c["reason"] for c in report["checks"] if c["state"] in ("failed", "unverified")]
    if says is None:
        assert not failed and report["counts"]["unverified"] == 0, report["checks"]
        assert report["counts"]["passed"] > 50
    else:
        assert any(says in reason for reason in failed), failed or report["checks"]


@pytest.mark.parametrize("cls, says", [
    (LeavesTheTemperatureToTheEngine,
     "1 engine keys that change the math are left at echo 1.2.0's default by the launches "
     "that read them: rollout.temperature"),
    (EchoAdapter, None)])
def test_a_math_default_left_to_the_engine_fails(tmp_path, cls, says):
    assert_one_check(run_kit(tmp_path, MODULE, cls, "::TestMistake", "math_defaults"), says)
