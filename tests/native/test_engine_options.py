"""``engine_options.native``: the native engine takes only its declared execution options.

Any other key used to plan and then go unread (the engine reads its settings from the spec),
the silent failure the options exist to prevent; a declared option must reach the code it
names, and change the binding, never the experiment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.common.errors import InvalidInput
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.registry import build_registry
from stateset_backend.native import options, trainer
from stateset_backend.native.layout import CONFIG_FILE, RUN_INFO_FILE
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.execution import execution_defaults

from .conftest import EXAMPLES


def _plan(doc: dict[str, Any], engine_options: dict[str, Any] | None = None) -> Any:
    doc = {**doc, "engine_options": {"native": engine_options} if engine_options else {}}
    return make_plan(ExperimentSpec.model_validate(doc), build_registry().get("native"),
                     "0.1.0", base_dir=EXAMPLES)


def _config(plan: Any) -> dict[str, Any]:
    return json.loads(plan.files[CONFIG_FILE])


def test_the_contract_declares_what_the_engine_implements():
    contract = build_registry().get("native").adapter.contract
    declared = execution_defaults(contract.dialect(parse_version("0.1.0")))
    assert {k: d.values for k, d in declared.items()} == options.ACCEPTED
    assert all(options.DEFAULTS[k] in d.values for k, d in declared.items())


def test_a_launch_writes_the_defaults_and_an_option_changes_the_binding_only(tiny):
    bare = _plan(tiny())
    fast = _plan(tiny(), {"sampling.kernels": "fast"})
    assert _config(bare)["execution"] == {"sampling.kernels": "exact"}
    assert _config(fast)["execution"] == {"sampling.kernels": "fast"}
    assert _config(fast)["settings"] == _config(bare)["settings"]  # the spec's, untouched
    assert fast.experiment_digest == bare.experiment_digest
    assert fast.binding_digest != bare.binding_digest
    assert fast.native["sampling.kernels"] == "fast"


@pytest.mark.parametrize(("given", "says"), [
    ({"sampling.attention": "batched"}, "its execution options are sampling.kernels"),
    ({"sampling": {"kernels": "fast"}}, "engine_options.native.sampling: "),
    ({"sampling.kernels": "slow"}, "'slow' is not one of the values that leave the math "
                                   "unchanged ('exact', 'fast')"),
    ({"sampling.kernels": True}, "True is not one of"),
    ({"algorithm.kl.coef": 0.5}, "change algorithm.kl.coef instead"),
])
def test_what_the_engine_would_not_read_is_refused_at_plan_time(tiny, given, says):
    with pytest.raises(InvalidInput, match=r"engine_options\.native") as caught:
        _plan(tiny(), given)
    assert says in caught.value.message


def test_a_conversation_keeps_the_exact_kernels():
    doc = json.loads((EXAMPLES / "support-agent.json").read_text())
    with pytest.raises(InvalidInput, match="a conversation samples each turn with the exact"):
        make_plan(ExperimentSpec.model_validate(
            {**doc, "engine_options": {"native": {"sampling.kernels": "fast"}}}),
            build_registry().get("native"), "0.1.0", base_dir=EXAMPLES)


@pytest.mark.parametrize(("changes", "says"), [
    ({"model.lora": {"rank": 4, "alpha": 8}}, "a LoRA model samples through its own forward"),
    ({"algorithm": {"objective": "sft"}, "budget.ppo_epochs": 1, "budget.mini_batches": 1,
      "evaluation.every": None}, "an sft run without validation samples nothing"),
])
def test_fast_kernels_a_run_would_not_use_are_refused(tiny, changes, says):
    with pytest.raises(InvalidInput, match=says):
        _plan(tiny(**changes), {"sampling.kernels": "fast"})
    _plan(tiny(**changes), {"sampling.kernels": "exact"})


def test_the_engine_refuses_fast_kernels_for_a_model_without_them(tiny, tmp_path, monkeypatch):
    """What the spec cannot show (the model's architecture) the engine checks at start: a
    model the fast decoder does not cover is an error, never a silent exact run."""
    plan = _plan(tiny(), {"sampling.kernels": "fast"})
    config = tmp_path / CONFIG_FILE
    config.write_text(plan.files[CONFIG_FILE])
    monkeypatch.setattr(trainer.grouped_llama, "supports", lambda model: False)
    (tmp_path / "out").mkdir()
    with pytest.raises(trainer.SettingsError, match="only the exact kernels"):
        trainer.Trainer(trainer.load_settings(config), tmp_path / "out")


def test_the_cli_refuses_an_unread_option_in_one_line(tiny, tmp_path, cli_in_process):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({**tiny(), "engine_options": {"native": {"compile": True}}}))
    done = cli_in_process("plan", "--engine", "native", path, "-o", tmp_path / "plan.json")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "engine_options.native.compile" in done.stderr
    assert not (tmp_path / "plan.json").exists()


def test_the_option_reaches_sampling_and_the_run_records_it(tiny, tmp_path, monkeypatch):
    plan = _plan(tiny(**{"budget.total_updates": 1, "checkpoint.every": None,
                         "evaluation.every": None}), {"sampling.kernels": "fast"})
    config = tmp_path / CONFIG_FILE
    config.write_text(plan.files[CONFIG_FILE])
    settings = trainer.load_settings(config)
    seen: list[str] = []
    real = trainer.sample

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["kernels"])
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "sample", spy)
    (tmp_path / "out").mkdir()
    run = trainer.Trainer(settings, tmp_path / "out")
    run.train()
    assert seen and set(seen) == {"fast"}
    info = json.loads((tmp_path / "out" / RUN_INFO_FILE).read_text())
    assert info["execution"] == {"sampling.kernels": "fast"}
    # the result is held to it: the run read back reports the plan's kernels, and a record
    # of other ones makes the run invalid
    entry = build_registry().get("native")
    collected = entry.adapter.collect(tmp_path / "out", None)
    assert collected.execution == {"sampling.kernels": "fast"}
    _, checks, _ = evaluate(plan, Exit(code=0), collected, tmp_path / "out")
    assert [c.ok for c in checks if c.name == "execution"] == [True]
    collected.execution = {"sampling.kernels": "exact"}
    status, checks, _ = evaluate(plan, Exit(code=0), collected, tmp_path / "out")
    assert status == "invalid" and [c.ok for c in checks if c.name == "execution"] == [False]


def test_the_engine_refuses_a_config_with_an_option_it_does_not_read(tiny, tmp_path: Path):
    doc = _config(_plan(tiny()))
    doc["execution"]["sampling.compile"] = True
    config = tmp_path / CONFIG_FILE
    config.write_text(json.dumps(doc))
    with pytest.raises(trainer.SettingsError,
                       match=r"sampling\.compile: the native engine reads its settings"):
        trainer.load_settings(config)
