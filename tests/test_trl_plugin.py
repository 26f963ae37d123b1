"""The TRL plugin: its contract against the installed TRL, its rules, its generated launch, and a
real training run through the hub on the CPU."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from kit_runs import assert_one_check, run_kit, trl_module
from optional_installs import TRL_PLUGIN_MISSING

from stateset_backend.conformance import AdapterConformance
from stateset_backend.contracts.loader import parse_version
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.rules import explain_rows, translate

plugin = pytest.importorskip("stateset_trl_engine.plugin", reason=TRL_PLUGIN_MISSING)
trl = pytest.importorskip("trl", reason=TRL_PLUGIN_MISSING)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SPEC = EXAMPLES / "support-routing.json"
VERSION = "1.16.0"


def spec_doc(example: Path = SPEC, **budget: Any) -> dict[str, Any]:
    """An example spec, its files named by absolute path so it can be written anywhere."""
    doc = json.loads(example.read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    doc["budget"].update(budget)
    return doc


def dialect() -> Any:
    return plugin.TRLAdapter().contract.dialect(parse_version(VERSION))


def config_defaults(config: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(config):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def grpo_defaults() -> dict[str, Any]:
    return config_defaults(trl.GRPOConfig)


class TestTRLConformance(AdapterConformance):
    engine_versions = ["1.15.0", VERSION]
    base = {"model": {"path": "builtin:tiny-llama-support"}, "data": {"chat_template": False}}

    @pytest.fixture
    def adapter(self):
        return plugin.TRLAdapter()


def test_recorded_defaults_are_grpo_configs_and_sft_configs_own():
    assert trl.__version__ == VERSION
    actual = {**grpo_defaults(),
              **{"sft." + k: v for k, v in config_defaults(trl.SFTConfig).items()}}
    recorded = dialect().defaults
    assert {k: actual[k] for k in recorded} == recorded


def test_the_shipped_field_lists_are_grpo_configs_and_sft_configs_own():
    assert plugin.grpo_config_fields() == {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert plugin.sft_config_fields() == {f.name for f in dataclasses.fields(trl.SFTConfig)}


def test_an_engine_option_that_is_no_grpo_config_field_is_refused_at_plan_time(cli,
                                                                              tmp_path):
    doc = spec_doc()
    doc["engine_options"] = {"trl": {"num_generation": 4}}
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    proc = cli("plan", "--engine", "trl", tmp_path / "spec.json", "-o", tmp_path / "p.json")
    assert proc.returncode == 2
    assert "engine_options.trl.num_generation: not a GRPOConfig field (did you mean " \
        "'num_generations'?)" in proc.stderr


def test_every_fixed_switch_and_key_is_a_config_field():
    fields, sft_fields = set(grpo_defaults()), set(config_defaults(trl.SFTConfig))
    keys = plugin.TRLAdapter().keys(dialect())
    from stateset_backend.plugin import DialectKeys

    shared = {"fixed", "sft_fixed", *DialectKeys.model_fields}  # the core's slots
    slots = {v for k, v in keys.model_dump().items() if k not in shared}
    assert slots <= fields | sft_fields
    assert set(keys.fixed) <= fields
    assert set(keys.sft_fixed) <= sft_fields
    # every switch TRL could use to change the math is set by every launch of its trainer
    assert set(keys.fixed) <= set(dialect().defaults)
    assert {"sft." + k for k in keys.sft_fixed} <= set(dialect().defaults)


def render(doc: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from stateset_backend.plugin import LaunchContext

    spec = parse_spec(doc)
    adapter = plugin.TRLAdapter()
    d = dialect()
    translation = translate(spec, adapter.rules(d), d, "trl", VERSION)
    ctx = LaunchContext("run-1", "sha256:" + "ab" * 32, VERSION, d, str(EXAMPLES))
    launch = adapter.render(translation, spec, ctx)
    tree = ast.parse(launch.files[plugin.LAUNCH_FILE])
    assign = tree.body[2]
    assert isinstance(assign, ast.Assign) and assign.targets[0].id == "SETTINGS"  # type: ignore[attr-defined]
    literal = assign.value.args[0]  # type: ignore[attr-defined]
    return launch, json.loads(ast.literal_eval(literal))


def test_launch_embeds_every_setting_as_one_literal_and_sets_every_default():
    _, settings = render(spec_doc(total_updates=7, mini_batches=2))
    config = settings["config"]
    assert set(config) <= set(grpo_defaults())
    assert {k for k in dialect().defaults if not k.startswith("sft.")} <= set(config)
    assert config["max_steps"] == 14  # optimizer steps: 7 updates x 2 mini-batches
    assert config["per_device_train_batch_size"] * config["steps_per_generation"] == 16 * 16
    assert config["run_name"] == "run-1." + "ab" * 32
    assert config["use_bias_correction_kl"] is False
    assert settings["launch"]["init_from_seed"] is True


def test_hostile_text_stays_data():
    doc = spec_doc()
    doc["data"]["train"]["prompt_field"] = 'p"]; import os; os.system("x") #\n'
    _, settings = render(doc)
    assert settings["launch"]["prompt_field"] == doc["data"]["train"]["prompt_field"]


def states(doc: dict[str, Any]) -> dict[str, str]:
    d = dialect()
    rows = explain_rows(parse_spec(doc), plugin.TRLAdapter().rules(d), d, "trl")
    return {r.path: r.state for r in rows}


def test_aggregations_map_to_trl_loss_types():
    for agg, ratio, objective, expected in [
            ("seq_mean_token_mean", "token", "grpo", "grpo"),
            ("token_mean", "token", "grpo", "bnpo"),
            ("seq_mean_token_sum_norm", "token", "dr_grpo", "dr_grpo"),
            ("seq_mean_token_sum", "sequence", "gspo", "luspo"),
            ("seq_mean_token_mean", "sequence", "gspo", "grpo")]:
        doc = spec_doc()
        doc["algorithm"].update(objective=objective, ratio_level=ratio, loss_aggregation=agg)
        _, settings = render(doc)
        assert settings["config"]["loss_type"] == expected, agg


def test_refused_and_declared():
    refused = {
        "algorithm.advantage.scope": {"advantage": {"scope": "batch"}},
        "algorithm.kl.placement": {"kl": {"coef": 0.01, "placement": "reward"}},
        "algorithm.kl.estimator": {"kl": {"coef": 0.01, "estimator": "k1"}},
        "algorithm.loss_aggregation": {"loss_aggregation": "seq_mean_token_sum"},
        "algorithm.objective": {"objective": "rloo"},
    }
    for path, change in refused.items():
        doc = spec_doc()
        doc["algorithm"].update(change)
        assert states(doc)[path] == "refused", path
    doc = json.loads(SPEC.read_text())
    doc["evaluation"] = {"every": 20, "select_by": "val/reward/mean"}
    got = states(doc)
    assert got["evaluation.every"] == "pinned" and got["evaluation.temperature"] == "pinned"
    # with checkpoint.keep too: the launch's retention never deletes the best
    assert got["evaluation.select_by"] == "pinned" and got["checkpoint.keep"] == "pinned"
    got = states(spec_doc())
    assert got["algorithm.advantage.epsilon"] == "declared"
    assert got["algorithm.kl.clamp"] == "declared"
    assert got["algorithm.ratio_level"] == "pinned"  # one optimizer step: the ratio is 1
    assert states(spec_doc(mini_batches=2))["budget.mini_batches"] == "declared"


def test_the_main_spec_plans_on_trl_unchanged(cli, tmp_path):
    """examples/support-routing.json (select_by with checkpoint.keep) runs on TRL as it does
    on the native engine: the launch hands the retention callback both, and turns TRL's own
    rotation off."""
    proc = cli("plan", "--engine", "trl", EXAMPLES / "support-routing.json", "-o",
               tmp_path / "plan.json")
    assert proc.returncode == 0, proc.stderr
    from stateset_backend.plan.launch_plan import load_plan

    native = plugin.read_launch(load_plan(tmp_path / "plan.json"))
    assert native["save_total_limit"] is None
    assert native["launch.keep"] == 2 and native["launch.select_by"] == "val/reward/mean"
    assert native["launch.lower_is_better"] is False


def test_strict_equivalence_refuses_trls_declared_deviations(cli, tmp_path):
    doc = spec_doc()
    doc["equivalence"] = "strict"
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    proc = cli("plan", "--engine", "trl", tmp_path / "spec.json", "-o", tmp_path / "p.json")
    assert proc.returncode == 3
    assert "group_std_plus_1e-4" in proc.stderr


@pytest.mark.slow
def test_trl_trains_the_tiny_model_through_the_hub(cli, tmp_path):
    doc = spec_doc(total_updates=4)
    doc["checkpoint"] = {"every": 2, "keep": 1}
    doc["evaluation"] = {"every": 2, "select_by": "val/reward/mean"}
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    proc = cli("run", "--engine", "trl", "--runs-dir", tmp_path / "runs", tmp_path / "spec.json",
               timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result_path = next((tmp_path / "runs").glob("*/result.json"))
    result = json.loads(result_path.read_text())
    assert result["status"] == "succeeded"
    assert result["engine"] == "trl" and result["engine_version"] == VERSION
    assert result["committed_updates"] == 4
    assert all(c["ok"] for c in result["checks"]), result["checks"]
    assert {"reward/mean", "loss/policy", "kl", "entropy", "grad_norm", "lr",
            "response_length/mean"} <= set(result["metrics"]["summary"])
    kinds = {a["kind"] for a in result["artifacts"]}
    assert kinds == {"checkpoint", "model"}
    steps = {a["step"] for a in result["artifacts"] if a["kind"] == "checkpoint"}
    # every 2 updates, keep 1: the newest, and the best by val/reward/mean (the earlier update
    # on a tie), which TRL's own rotation would have deleted
    selection = result["selection"]
    assert selection["update"] in (2, 4) and steps == {4, selection["update"]}
    names = {d["deviation"] for d in result["deviations"]}
    assert "group_std_plus_1e-4" in names
    # the spec's validation, by the launch's callback: untrained, then every 2 updates
    attempt = result_path.parent / "attempts" / "1"
    rows = [json.loads(x) for x in (attempt / result["metrics"]["series"]).read_text()
            .splitlines()]
    assert [r["step"] for r in rows if "val/reward/mean" in r] == [0, 2, 4]
    at = {r["step"]: r["val/reward/mean"] for r in rows if "val/reward/mean" in r}
    best = max(at[2], at[4])
    assert selection["update"] == min(u for u in (2, 4) if at[u] == best)
    # the same seed builds the same tiny model on both engines, and greedy validation of the
    # untrained policy is deterministic: the native engine scores it exactly the same
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(doc)
    native = Trainer(RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                                 tmp_path), tmp_path / "native")
    assert native.validate()["val/reward/mean"] == rows[0]["val/reward/mean"]


class SpellsALossTypeTRLLacks(plugin.TRLAdapter):
    """Writes ``dr-grpo`` for the normalised sequence sum: GRPOConfig takes any string, and
    GRPOTrainer's dispatch knows ``dr_grpo``."""

    def rules(self, dialect):
        from stateset_backend.translate.rules import Pinned

        f = self.keys(dialect)

        def respelt(rule):
            def wrapped(value, spec):
                out = rule(value, spec)
                if isinstance(out, Pinned) and out.native.get(f.loss_type) == "dr_grpo":
                    return Pinned({**out.native, f.loss_type: "dr-grpo"}, out.how, out.hub)
                return out
            return wrapped

        return {path: respelt(rule) if callable(rule) else rule
                for path, rule in super().rules(dialect).items()}


class AsShipped(plugin.TRLAdapter):
    """The plugin unchanged."""


@pytest.mark.parametrize("cls, says", [
    (SpellsALossTypeTRLLacks, "loss_type = 'dr-grpo': trl 1.16.0 implements only 'bnpo'"),
    (AsShipped, None)])
def test_the_kit_holds_loss_types_to_what_grpo_trainer_implements(tmp_path, cls, says):
    report = run_kit(tmp_path, trl_module("test_trl_plugin", VERSION), cls, "::TestMistake",
                     "launch_reads_back_as_declared")
    assert_one_check(report, says)


class CountsOptimizerSteps(plugin.TRLAdapter):
    """Takes the updates an attempt committed from TRL's logged step, which counts optimizer
    steps: right only while an update is one optimizer step."""

    def collect(self, attempt_dir, ctx):
        out = super().collect(attempt_dir, ctx)
        log = attempt_dir / plugin.METRICS_FILE
        if log.is_file():
            steps = [json.loads(line).get("step", 0) for line in log.read_text().splitlines()
                     if line.strip()]
            out.committed_updates = max(steps, default=0)
        return out


@pytest.mark.parametrize("cls, says", [
    (CountsOptimizerSteps, "committed_updates is 8, but the outputs show 4 updates"),
    (AsShipped, None)])
def test_the_kit_gives_an_update_several_optimizer_steps(tmp_path, cls, says):
    report = run_kit(tmp_path, trl_module("test_trl_plugin", VERSION), cls, "::TestMistake",
                     "collection and several_optimizer_steps")
    assert_one_check(report, says)
