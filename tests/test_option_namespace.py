"""``engine_options`` names only keys of the engine's own configuration: never Hydra's own
namespace (which steers the launcher: where it writes, which folder it runs in, where it looks
for config), an edit prefix, an instruction to Hydra's instantiate, an environment variable,
override syntax, or an abbreviated flag; and, with the release's surface, only a key that
release reads. Every refusal is exit 2 on one line naming the key, through the CLI in process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.cli import main
from stateset_backend.contracts.surfaces import namespace_problem

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "external"
ENGINES = {"verl": "0.9.1", "openrlhf": "0.11.2", "nemo-rl": "0.7.0"}

HYDRA_NAMESPACE = ["hydra.run.dir", "hydra.job.chdir", "hydra.output_subdir",
                   "hydra.searchpath", "hydra.job_logging.handlers.file.filename",
                   "hydra.sweep.dir", "hydra", "HYDRA.run.dir"]
LAUNCHER_SYNTAX = ["+trainer.total_epochs", "++trainer.total_epochs", "~trainer.total_epochs",
                   "actor_rollout_ref.actor._target_", "critic._recursive_",
                   "trainer.total_epochs=3", "trainer.total_epochs@pkg", "a b", "x:y",
                   "${oc.env:HOME}", "-h", ""]
ENVIRONMENT_LIKE = ["LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HYDRA_FULL_ERROR"]


@pytest.fixture
def grpo(tmp_path: Path) -> dict[str, Any]:
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    return json.loads((EXAMPLES / "grpo.json").read_text())


def _plan(capsys, tmp_path: Path, doc: dict[str, Any], engine: str) -> tuple[int, str, Path]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / f"{engine}.plan.json"
    code = main(["plan", "--engine", engine, "--engine-version", ENGINES[engine], str(spec),
                 "-o", str(out)])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) <= 1 and "Traceback" not in err, err
    return code, (lines[0] if lines else ""), out


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("key", HYDRA_NAMESPACE + LAUNCHER_SYNTAX + ENVIRONMENT_LIKE)
def test_a_key_outside_the_engines_configuration_is_refused(capsys, tmp_path, grpo, engine,
                                                            key):
    if engine == "openrlhf" and key.startswith(("+", "~")):
        key = "--" + key.lstrip("+~")  # an argparse engine's spelling of the same trick
    grpo["engine_options"] = {engine: {key: "/tmp/elsewhere"}}
    code, line, out = _plan(capsys, tmp_path, grpo, engine)
    assert code == 2, line
    assert f"engine_options.{engine}.{key}:" in line, line
    assert not out.exists()


def test_hydra_namespace_never_reaches_a_verl_launch(capsys, tmp_path, grpo):
    """The defect as found: each of these planned with exit 0 and Hydra acted on it."""
    for key in HYDRA_NAMESPACE[:5]:
        grpo["engine_options"] = {"verl": {key: "/some/dir"}}
        code, line, _ = _plan(capsys, tmp_path, grpo, "verl")
        assert code == 2 and "Hydra's own namespace" in line, line


@pytest.mark.parametrize("engine, key, fragment", [
    ("verl", "trainer.no_such_key", "verl 0.9.1 has no option 'trainer.no_such_key'"),
    ("verl", "actor_rollout_ref.model.override_config.attn_implementation",
     "give that mapping whole, as 'actor_rollout_ref.model.override_config': {...}"),
    ("nemo-rl", "logger.no_such_logger", "nemo-rl 0.7.0 has no option"),
    ("openrlhf", "--logger.wandb.proj",
     "argparse would read it as an abbreviation of '--logger.wandb.project'"),
    ("openrlhf", "logger.wandb.project", "has no option 'logger.wandb.project'"),
])
def test_a_key_the_release_does_not_read_is_refused(capsys, tmp_path, grpo, engine, key,
                                                    fragment):
    grpo["engine_options"] = {engine: {key: "x"}}
    code, line, _ = _plan(capsys, tmp_path, grpo, engine)
    assert code == 2 and f"engine_options.{engine}.{key}: " in line and fragment in line, line


def test_keys_of_the_engines_own_configuration_still_plan(capsys, tmp_path, grpo):
    grpo["engine_options"] = {"verl": {"trainer.log_val_generations": 3,
                                       "actor_rollout_ref.model.use_remove_padding": False,
                                       "actor_rollout_ref.model.override_config":
                                           {"attn_implementation": "eager"}}}
    code, line, out = _plan(capsys, tmp_path, grpo, "verl")
    assert code == 0, line
    argv = json.loads(out.read_text())["argv"]
    assert "trainer.log_val_generations=3" in argv
    # verl composes in struct mode: a mapping brings new keys only through force-add
    assert "++actor_rollout_ref.model.override_config={attn_implementation:eager}" in argv
    grpo["engine_options"] = {"nemo-rl": {"logger.wandb.project": "team"}}
    code, line, _ = _plan(capsys, tmp_path, grpo, "nemo-rl")
    assert code == 0, line


def test_the_namespace_rule_is_syntactic_and_spares_ordinary_keys():
    for key in ("trainer.total_epochs", "--actor.adam.lr", "behaviour", "sft.max_length",
                "actor_rollout_ref.rollout.engine_kwargs.vllm"):
        assert namespace_problem(key) is None, key
    for key in HYDRA_NAMESPACE + LAUNCHER_SYNTAX + ENVIRONMENT_LIKE:
        assert namespace_problem(key) is not None, key


def test_a_value_the_release_does_not_implement_is_refused(capsys, tmp_path, grpo):
    """verl's config takes any string; the release's code implements a few (the domain the
    surface generator reads from its dispatch): a misspelt one is refused at plan time."""
    grpo["engine_options"] = {"verl": {"critic.loss_agg_mode": "token_sum"}}
    code, line, out = _plan(capsys, tmp_path, grpo, "verl")
    assert code == 2 and "engine_options.verl.critic.loss_agg_mode: " in line, line
    assert "verl 0.9.1 implements 'seq-mean-token-mean'" in line and not out.exists()
    grpo["engine_options"] = {"verl": {"critic.loss_agg_mode": "token-sum"}}
    assert _plan(capsys, tmp_path, grpo, "verl")[0] == 0
