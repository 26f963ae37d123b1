"""Supervised fine-tuning and warm starts on TRL: objective sft runs on TRL's SFTTrainer with
the spec's meaning (loss on the answer tokens only, the spec's layout, the native engine's
metric names, validation and selection, exact resume), and ``model.from_run`` starts a TRL run
from a stored checkpoint of either engine."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from interrupting import interrupt_when, write_holding_reward
from optional_installs import TRL_PLUGIN_MISSING
from test_trl_plugin import dialect, spec_doc

from stateset_backend.cli import main
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.rules import explain_rows, translate

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)

plugin = pytest.importorskip("stateset_trl_engine.plugin", reason=TRL_PLUGIN_MISSING)
trl = pytest.importorskip("trl", reason=TRL_PLUGIN_MISSING)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
VERSION = "1.16.0"
UPDATES, RESUMED_AT = 6, 2


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sft_doc(**budget: Any) -> dict[str, Any]:
    """examples/support-routing-sft.json, its files named by absolute path."""
    return spec_doc(EXAMPLES / "support-routing-sft.json", **budget)


def render(doc: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from stateset_backend.plugin import LaunchContext

    spec = parse_spec(doc)
    adapter, d = plugin.TRLAdapter(), dialect()
    translation = translate(spec, adapter.rules(d), d, "trl", VERSION)
    ctx = LaunchContext("run-1", "sha256:" + "ab" * 32, VERSION, d, str(EXAMPLES))
    launch = adapter.render(translation, spec, ctx)
    tree = ast.parse(launch.files[plugin.LAUNCH_FILE])
    literal = tree.body[2].value.args[0]  # type: ignore[attr-defined]
    return launch, json.loads(ast.literal_eval(literal))


def states(doc: dict[str, Any]) -> dict[str, Any]:
    d = dialect()
    return {r.path: r for r in explain_rows(parse_spec(doc), plugin.TRLAdapter().rules(d), d,
                                            "trl")}


# -- planning -------------------------------------------------------------------------------
def test_sft_runs_on_sfttrainer_with_its_own_config_keys():
    launch, settings = render(sft_doc())
    assert settings["trainer"] == "sft"
    config = settings["config"]
    assert set(config) <= {f.name for f in dataclasses.fields(trl.SFTConfig)}
    # the answer tokens' NLL only, one optimizer step of the update's 32 rows per update
    assert config["loss_type"] == "nll" and config["completion_only_loss"] is True
    assert config["per_device_train_batch_size"] == 32
    assert config["gradient_accumulation_steps"] == 1 and config["max_steps"] == 60
    assert config["padding_free"] is True and config["packing"] is False  # layout packed
    assert config["max_length"] is None and config["shuffle_dataset"] is False
    assert config["train_sampling_strategy"] == "random" and config["dataloader_drop_last"]
    assert config["learning_rate"] == 0.003 and config["warmup_steps"] == 5
    assert settings["launch"]["max_response_tokens"] == 2
    # every SFTConfig default the contract records is set; GRPOConfig's are not read
    recorded = dialect().defaults
    assert {k.removeprefix("sft.") for k in recorded if k.startswith("sft.")} <= set(config)
    assert set(launch.unread_defaults) == {k for k in recorded if not k.startswith("sft.")}
    assert all("GRPOConfig" in why for why in launch.unread_defaults.values())
    assert set(launch.native) >= {"sft." + k for k in config}


def test_the_padded_layout_pads_and_other_aggregations_are_refused():
    doc = sft_doc()
    doc["algorithm"]["sft"]["layout"] = "padded"
    assert render(doc)[1]["config"]["padding_free"] is False
    doc["algorithm"]["loss_aggregation"] = "seq_mean_token_mean"
    row = states(doc)["algorithm.loss_aggregation"]
    assert row.state == "refused" and "token mean" in row.reason


def test_grpo_launches_leave_sftconfig_unread_and_keep_their_keys():
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    launch, settings = render(doc)
    assert settings["trainer"] == "grpo" and "num_generations" in settings["config"]
    assert set(launch.unread_defaults) == {k for k in dialect().defaults
                                           if k.startswith("sft.")}


def test_an_sft_engine_option_is_an_sftconfig_field_under_sft(cli, tmp_path):
    doc = sft_doc()
    doc["engine_options"] = {"trl": {"neftune_noise_alpha": 5.0}}
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    proc = cli("plan", "--engine", "trl", tmp_path / "spec.json", "-o", tmp_path / "p.json")
    assert proc.returncode == 2
    assert "engine_options.trl.neftune_noise_alpha: an sft spec runs SFTTrainer" in proc.stderr
    assert "'sft.neftune_noise_alpha'" in proc.stderr
    # a key the launch sets is refused in its sft. spelling too
    doc["engine_options"] = {"trl": {"sft.completion_only_loss": False}}
    (tmp_path / "spec.json").write_text(json.dumps(doc))
    proc = cli("plan", "--engine", "trl", tmp_path / "spec.json", "-o", tmp_path / "p.json")
    assert proc.returncode == 2, proc.stderr


def test_the_sft_example_and_its_warm_start_plan_on_trl(cli, tmp_path):
    proc = cli("plan", "--engine", "trl", EXAMPLES / "support-routing-sft.json", "-o",
               tmp_path / "sft.json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "sft.json").read_text())
    assert plan["unread_defaults"] and "sft.padding_free" in plan["native"]
    proc = cli("plan", "--engine", "trl", EXAMPLES / "support-routing-from-sft.json", "-o",
               tmp_path / "from.json")
    assert proc.returncode == 0, proc.stderr
    native = json.loads((tmp_path / "from.json").read_text())["native"]
    assert native["launch.from_run_sha256"] == "0" * 64


def test_ppo_is_refused_for_what_trl_lacks():
    doc = json.loads((EXAMPLES / "support-routing-ppo.json").read_text())
    row = states(doc)["algorithm.objective"]
    assert row.state == "refused" and "TRL 1.16 has no trainer with a critic" in row.reason


@pytest.mark.parametrize(("example", "says"), [
    ("support-routing-ppo.json", "critic (TRL 1.16 has no trainer with a critic"),
    ("support-agent.json", "tool_use (TRL 1.16's GRPOTrainer can roll out conversations"),
    ("support-routing-ddp.json", "TRL trains data-parallel when started under accelerate "
                                 "launch or torchrun"),
])
def test_every_other_example_is_refused_saying_whether_trl_or_the_plugin_lacks_it(
        cli, tmp_path, example, says):
    proc = cli("plan", "--engine", "trl", EXAMPLES / example, "-o", tmp_path / "p.json")
    assert proc.returncode == 3, proc.stderr
    assert says in proc.stderr
    assert ("does not translate" in proc.stderr) == (example != "support-routing-ppo.json")


# -- the launch's own code, on a tiny batch -------------------------------------------------
@pytest.fixture(scope="module")
def launch_code(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any]]:
    """The generated launch's functions (everything but its final ``main()``), as they run."""
    launch, settings = render(sft_doc())
    source = launch.files[plugin.LAUNCH_FILE]
    assert source.rstrip().endswith("\nmain()")
    folder = tmp_path_factory.mktemp("launch")
    namespace: dict[str, Any] = {"__file__": str(folder / plugin.LAUNCH_FILE),
                                 "__name__": "stateset_trl_launch"}
    exec(compile(source.rstrip().removesuffix("main()"), plugin.LAUNCH_FILE, "exec"), namespace)
    return namespace, settings


ROWS = 6


@pytest.fixture(scope="module")
def sft_batches(launch_code, tmp_path_factory):
    """TRL's SFTTrainer on the launch's first rows: its prepared rows, and the batch it collates
    for each layout, with the model it was built around."""
    import torch
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    ns, settings = launch_code
    launch = settings["launch"]
    tokenizer = ns["load_tokenizer"](launch)
    examples = ns["sft_examples"](launch, tokenizer, launch["train_uri"],
                                  launch["prompt_field"], launch["answer_field"], "train")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(launch["model"]),
                                             dtype=torch.float32)
    config = {**settings["config"], "output_dir": str(tmp_path_factory.mktemp("sft")),
              "use_cpu": True}
    trainer = trl.SFTTrainer(model=model, args=trl.SFTConfig(**config),
                             train_dataset=Dataset.from_list(examples[:ROWS]),
                             processing_class=tokenizer)
    rows = [trainer.train_dataset[i] for i in range(ROWS)]
    batches = {padding_free: DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id, padding_free=padding_free)(rows)
        for padding_free in (False, True)}
    return examples[:ROWS], rows, batches, trainer


def test_trl_labels_only_the_answer_tokens(sft_batches):
    examples, rows, batches, _ = sft_batches
    for example, row in zip(examples, rows, strict=True):
        mask = example["completion_mask"]
        assert 0 < sum(mask) <= 2 and mask[0] == 0  # answer and EOS, cut at 2 tokens
        assert row["labels"] == [t if m else -100 for t, m in
                                 zip(example["input_ids"], mask, strict=True)]
    padded = batches[False]
    for n, example in enumerate(examples):
        learned = (padded["labels"][n] != -100).tolist()
        assert learned == [bool(m) for m in example["completion_mask"]] + \
            [False] * (padded["labels"].shape[1] - len(example["input_ids"]))
    # packed: one sequence, positions restarting at every row, the same tokens learned
    packed = batches[True]
    assert packed["input_ids"].shape[0] == 1 and "attention_mask" not in packed
    starts = (packed["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert starts == [sum(len(e["input_ids"]) for e in examples[:n]) for n in range(ROWS)]
    assert (packed["labels"][0] != -100).tolist() == \
        [bool(m) for e in examples for m in e["completion_mask"]]


def test_packed_and_padded_batches_give_trl_the_native_engines_loss(sft_batches, tmp_path):
    """transformers masks attention across packed rows: TRL's loss on the padding-free batch
    equals its loss on the padded one, and both equal the native engine's answer-token loss
    on the same rows (tokenized by the native engine, which gives the same ids)."""
    import torch

    from stateset_backend.native.sft.objective import lay_out, sft_loss
    from stateset_backend.native.sft.trainer import SFTTrainer
    from stateset_backend.native.trainer import RunSettings
    from stateset_backend.spec.digest import experiment_digest

    examples, _, batches, trainer = sft_batches
    spec = parse_spec(sft_doc())
    native = SFTTrainer(RunSettings("20260101T000000Z-00000000", experiment_digest(spec), spec,
                                    tmp_path), tmp_path / "native")
    mine = native.train_examples[:ROWS]
    assert [m.prompt_ids + m.answer_ids for m in mine] == [e["input_ids"] for e in examples]
    assert [len(m.answer_ids) for m in mine] == [sum(e["completion_mask"]) for e in examples]
    model = trainer.model
    model.eval()
    with torch.no_grad():
        losses = {free: float(trainer.compute_loss(model, dict(batch)))
                  for free, batch in batches.items()}
        expected = {layout: float(sft_loss(model, lay_out(mine, layout, pad_id=0, capacity=50),
                                           "token_mean", 2)[0])
                    for layout in ("padded", "packed")}
    assert losses[True] == pytest.approx(losses[False], abs=1e-6)
    assert losses[True] == pytest.approx(expected["packed"], abs=1e-5)
    assert losses[False] == pytest.approx(expected["padded"], abs=1e-5)


# -- through the hub: train, select, resume exactly, warm start ---------------------------------
def _small_sft(folder: Path) -> dict[str, Any]:
    """8 training rows, 4 per update: each pass is 2 updates, so the resumed attempt starts
    the second pass."""
    doc = sft_doc(total_updates=UPDATES, prompts_per_update=4)
    reward = write_holding_reward(folder / "reward.py", Path(
        doc["reward"]["entrypoint"].rpartition(":")[0]).read_text())
    doc["reward"].update(entrypoint=f"{reward}:score", sha256=_sha256(reward))
    for split, rows in (("train", 8), ("validation", 16)):
        lines = Path(doc["data"][split]["uri"]).read_text().splitlines()[:rows]
        path = folder / f"{split}.jsonl"
        path.write_text("".join(line + "\n" for line in lines))
        doc["data"][split].update(uri=str(path), sha256=_sha256(path))
    doc["optim"]["warmup_steps"] = 1
    doc["checkpoint"] = {"every": 2, "keep": 1}
    doc["evaluation"] = {"every": 2, "select_by": "val/loss"}
    return doc


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("trl-sft")
    spec, plan = folder / "spec.json", folder / "plan.json"
    spec.write_text(json.dumps(_small_sft(folder)))
    assert main(["plan", "--engine", "trl", str(spec), "-o", str(plan)]) == 0
    return plan, json.loads(plan.read_text())["run_id"]


@pytest.fixture(scope="module")
def straight(plan, tmp_path_factory) -> Path:
    path, run_id = plan
    runs = tmp_path_factory.mktemp("straight")
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(path)]) == 0
    return runs / run_id


def _result(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "result.json").read_text()))


def _series(run: Path, attempt: int) -> list[dict[str, Any]]:
    folder = run / "attempts" / str(attempt)
    name = json.loads((folder / "result.json").read_text())["metrics"]["series"]
    return [json.loads(line) for line in (folder / name).read_text().splitlines()]


@pytest.mark.slow
def test_sft_trains_on_trl_validates_and_selects_by_val_loss(straight, tmp_path):
    result = _result(straight)
    assert result["status"] == "succeeded" and result["committed_updates"] == UPDATES
    assert all(c["ok"] for c in result["checks"]), result["checks"]
    assert {"loss/sft", "token_accuracy", "grad_norm", "lr", "val/loss", "val/token_accuracy",
            "val/reward/mean"} <= set(result["metrics"]["summary"])
    rows = _series(straight, 1)
    assert [r["step"] for r in rows if "loss/sft" in r] == list(range(1, UPDATES + 1))
    val = {r["step"]: r["val/loss"] for r in rows if "val/loss" in r}
    assert sorted(val) == [0, 2, 4, 6]
    assert val[UPDATES] < val[0] - 1.0  # the answers are learned
    # checkpoints every 2 updates, keep 1: the newest and the lowest val/loss
    selection = result["selection"]
    assert selection["direction"] == "min"
    assert selection["update"] == min((u for u in (2, 4, 6)), key=lambda u: (val[u], u))
    steps = {a["step"] for a in result["artifacts"] if a["kind"] == "checkpoint"}
    assert steps == {UPDATES, selection["update"]}
    # the same seed builds the same tiny model on both engines: the untrained model's
    # validation is the native engine's
    from stateset_backend.native.sft.trainer import SFTTrainer
    from stateset_backend.native.trainer import RunSettings

    plan = json.loads((straight / "plan.json").read_text())
    spec = parse_spec(plan["spec"], source="plan.spec", stored=True)
    native = SFTTrainer(RunSettings(plan["run_id"], plan["experiment_digest"], spec, tmp_path),
                        tmp_path / "native").validate()
    assert rows[0]["val/reward/mean"] == native["val/reward/mean"]
    assert rows[0]["val/loss"] == pytest.approx(native["val/loss"], abs=1e-5)
    assert rows[0]["val/token_accuracy"] == native["val/token_accuracy"]


@pytest.fixture(scope="module")
def resumed(plan, tmp_path_factory) -> Path:
    """The run stopped with Ctrl-C once the checkpoint of update 2 is sealed, then continued
    with `run PLAN --resume`."""
    path, run_id = plan
    runs = tmp_path_factory.mktemp("interrupted")
    sealed = runs / run_id / "attempts/1/checkpoints" / f"checkpoint-{RESUMED_AT}" / \
        "manifest.json"
    interrupt_when(["run", "--runs-dir", str(runs), "--quiet", str(path)], sealed)
    assert main(["run", "--runs-dir", str(runs), "--resume", "--quiet",
                 str(runs / run_id / "plan.json")]) == 0
    return runs / run_id


@pytest.mark.slow
def test_an_interrupted_sft_run_resumes_bit_for_bit(straight, resumed):
    import torch
    from safetensors.torch import load_file

    result = _result(resumed)
    assert result["status"] == "succeeded" and result["resumed_from"]["update"] == RESUMED_AT
    mine = load_file(str(resumed / "attempts/2/final/model.safetensors"))
    theirs = load_file(str(straight / "attempts/1/final/model.safetensors"))
    assert mine.keys() == theirs.keys()
    assert [k for k in theirs if not torch.equal(mine[k], theirs[k])] == []
    last = f"checkpoints/checkpoint-{UPDATES}"
    a = torch.load(resumed / "attempts/2" / last / "optimizer.pt", weights_only=False)
    b = torch.load(straight / "attempts/1" / last / "optimizer.pt", weights_only=False)
    assert a["state"].keys() == b["state"].keys()
    assert all(torch.equal(a["state"][k][m], b["state"][k][m]) for k in a["state"]
               for m in ("exp_avg", "exp_avg_sq"))
    # every update after the checkpoint trained once, with the uninterrupted run's metrics
    trained = [json.loads(x)["update"] for x in
               (resumed / "attempts/2/trl_metrics.jsonl").read_text().splitlines()
               if "logs" in json.loads(x)]
    assert trained == list(range(RESUMED_AT + 1, UPDATES + 1))
    assert _series(resumed, 2) == _series(straight, 1)
    assert all(math.isfinite(v) for r in _series(resumed, 2) for v in r.values())
    assert {k: result["selection"][k] for k in ("update", "value")} == \
        {k: _result(straight)["selection"][k] for k in ("update", "value")}


def _grpo_from(folder: Path, store: Path, run_id: str) -> Path:
    """A 2-update GRPO spec starting from ``run_id``'s newest checkpoint (`runs from-run`)."""
    doc = json.loads((EXAMPLES / "support-routing-from-sft.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    doc["algorithm"]["group_size"] = 4
    doc["budget"].update(total_updates=2, prompts_per_update=4)
    doc["checkpoint"], doc["evaluation"] = {"every": None}, {"every": None}
    template, spec = folder / "template.json", folder / "spec.json"
    template.write_text(json.dumps(doc))
    assert main(["runs", "from-run", run_id, "--runs-dir", str(store), "--spec", str(template),
                 "--output", str(spec)]) == 0
    return spec


def _starting_weights(store: Path, spec: Path) -> tuple[dict[str, Any], Path]:
    assert main(["run", "--engine", "trl", "--runs-dir", str(store), "--quiet", str(spec)]) == 0
    from safetensors.torch import load_file

    ref = json.loads(spec.read_text())["model"]["from_run"]
    (warm,) = [p.parent for p in store.glob("*/plan.json")
               if json.loads(p.read_text())["spec"]["model"].get("from_run") == ref]
    assert _result(warm)["status"] == "succeeded"
    assert json.loads((warm / "plan.json").read_text())["native"]["launch.from_run_sha256"] == \
        ref["sha256"]
    attempt = warm / "attempts/1"
    return load_file(str(attempt / "initial_model/model.safetensors")), attempt


@pytest.mark.slow
def test_a_trl_run_starts_from_a_trl_sft_checkpoint(straight, tmp_path):
    import torch
    from safetensors.torch import load_file

    spec = _grpo_from(tmp_path, straight.parent, straight.name)
    ref = json.loads(spec.read_text())["model"]["from_run"]
    assert ref["checkpoint"] == f"update-{UPDATES:06d}"  # TRL's checkpoint-6, by its update
    start, attempt = _starting_weights(straight.parent, spec)
    staged = load_file(str(straight / "attempts/1/checkpoints" / f"checkpoint-{UPDATES}" /
                           "model.safetensors"))
    assert start.keys() == staged.keys()
    assert all(torch.equal(start[k], staged[k]) for k in staged)
    assert _sha256(attempt / "from_run/manifest.json") == ref["sha256"]


@pytest.mark.slow
def test_a_trl_run_starts_from_a_native_sft_checkpoint(tmp_path):
    import torch
    from safetensors.torch import load_file

    doc = _small_sft(tmp_path)
    doc["budget"]["total_updates"] = 2
    doc["evaluation"] = {"every": None}
    (tmp_path / "sft.json").write_text(json.dumps(doc))
    store = tmp_path / "runs"
    assert main(["run", "--engine", "native", "--runs-dir", str(store), "--quiet",
                 str(tmp_path / "sft.json")]) == 0
    (sft_run,) = [p.parent for p in store.glob("*/result.json")]
    spec = _grpo_from(tmp_path, store, sft_run.name)
    start, attempt = _starting_weights(store, spec)
    staged = load_file(str(sft_run / "attempts/1/checkpoints/update-000002/weights.safetensors"))
    assert start.keys() == staged.keys()
    assert all(torch.equal(start[k], staged[k]) for k in staged)
    assert "starting from weights.safetensors of the staged checkpoint" in \
        (attempt / "stdout.log").read_text()
