"""Hostile and careless specs, through the CLI's own main() in process: a user string that would
become an interpolation, a path or a secret is refused or made safe at plan time; every input
the loader accepts digests, checks and plans without exit 1; a spec the engine cannot carry is
a refusal naming the setting, never an adapter bug; every error is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.cli import main
from stateset_backend.translate import overrides

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "external"
ENGINES = (("verl", "0.9.1"), ("openrlhf", "0.11.2"), ("nemo-rl", "0.7.0"))
SECRET = "${oc.env:AWS_SECRET_ACCESS_KEY}"


def _cli(capsys, *args: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _write(tmp_path: Path, doc: dict[str, Any] | str, name: str = "spec.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def _plan(capsys, tmp_path: Path, doc: dict[str, Any], engine: str, version: str):
    spec = _write(tmp_path, doc)
    out = tmp_path / f"{engine}.plan.json"
    code, _, err = _cli(capsys, "plan", "--engine", engine, "--engine-version", version, spec,
                        "-o", out)
    return code, err, (json.loads(out.read_text()) if code == 0 else None)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# -- a secret copied into the run -----------------------------------------------------------------
@pytest.mark.parametrize("field", ["model.path", "data.train.uri", "lora", "option",
                                   "prompt_field"])
def test_an_interpolation_verl_would_resolve_is_refused_naming_the_field(
        capsys, tmp_path, grpo, field):
    """verl resolves its config in place and Hydra's instantiate resolves it again, so no escape
    carries '${' through every read: refused at plan time, the field named."""
    value = SECRET
    if field == "model.path":
        grpo["model"] = {"path": value, "dtype": "bfloat16"}
    elif field == "data.train.uri":
        grpo["data"]["train"]["uri"] = f"data/{value}.parquet"
    elif field == "lora":
        grpo["model"]["lora"] = {"rank": 8, "alpha": 16, "target_modules": [value]}
    elif field == "prompt_field":
        grpo["data"]["train"]["prompt_field"] = grpo["data"]["validation"]["prompt_field"] = value
    else:
        grpo["engine_options"] = {"verl": {"trainer.validation_data_dir": value}}
    code, err, _ = _plan(capsys, tmp_path, grpo, "verl", "0.9.1")
    line = _one_line(err)
    assert code == 2, line
    expected = {"lora": ["model.lora.target_modules"],
                "option": ["engine_options.verl.trainer.validation_data_dir"],
                "prompt_field": ["data.train.prompt_field", "data.validation.prompt_field"]
                }.get(field, [field])
    assert any(f"error: {e}: " in line for e in expected) and "interpolation" in line, line


def test_a_name_holding_an_interpolation_never_reaches_verl(capsys, tmp_path, grpo):
    grpo["name"] = SECRET
    code, err, plan = _plan(capsys, tmp_path, grpo, "verl", "0.9.1")
    assert code == 0, err
    assert plan["spec"]["name"] == SECRET  # kept as data in the plan
    assert plan["native"]["trainer.project_name"] == "oc.env-AWS_SECRET_ACCESS_KEY"
    assert not any("${" in a for a in plan["argv"])


@pytest.mark.parametrize("engine, version", [("nemo-rl", "0.7.0")])
def test_engines_that_resolve_once_carry_the_interpolation_escaped(
        capsys, tmp_path, grpo, engine, version):
    """NeMo RL reads its config through one ``to_container(resolve=True)``: an escaped '${'
    reads back as the literal there (tests/engines/test_injection.py reads it back)."""
    grpo["model"] = {"path": SECRET, "dtype": "bfloat16"}
    code, err, plan = _plan(capsys, tmp_path, grpo, engine, version)
    assert code == 0, err
    assert f"policy.model_name={overrides.value(SECRET)}" in plan["argv"]


# -- a name that picks a path ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../x", "/abs/path", "a/b", "..", ".", "~", "a\\b", ""])
def test_the_name_never_chooses_where_verl_writes(capsys, tmp_path, grpo, name):
    grpo["name"] = name
    code, err, plan = _plan(capsys, tmp_path, grpo, "verl", "0.9.1")
    if name == "":
        assert code == 2, err  # the spec requires a name
        return
    assert code == 0, err
    project = plan["native"]["trainer.project_name"]
    assert project not in (".", "..") and "/" not in project and "\\" not in project
    run_name = plan["native"]["trainer.experiment_name"]
    assert plan["set_env"] == {"VERL_FILE_LOGGER_PATH": f"{{run_dir}}/{run_name}.jsonl"}


def test_a_verl_release_before_the_file_logger_names_its_tensorboard_folder(
        capsys, tmp_path, grpo):
    grpo["name"] = "../../x"
    code, err, plan = _plan(capsys, tmp_path, grpo, "verl", "0.5.0")
    assert code == 0, err
    run_name = plan["native"]["trainer.experiment_name"]
    assert plan["set_env"] == {"TENSORBOARD_DIR": f"{{run_dir}}/logs/{run_name}"}


# -- exit 1 after validate said valid -------------------------------------------------------------
@pytest.mark.parametrize("where", ["data.train.uri", "reward.entrypoint", "model.path"])
def test_a_path_no_filesystem_can_hold_is_invalid_at_validate(capsys, tmp_path, grpo, where):
    long = "a" * 300
    if where == "data.train.uri":
        grpo["data"]["train"]["uri"] = f"data/{long}.parquet"
    elif where == "reward.entrypoint":
        grpo["reward"]["entrypoint"] = f"{long}.py:score"
    else:
        grpo["model"] = {"path": f"/models/{long}", "dtype": "bfloat16"}
    spec = _write(tmp_path, grpo)
    for command in (["validate"], ["digest"], ["check", "--engine", "verl",
                                               "--engine-version", "0.9.1"]):
        code, _, err = _cli(capsys, *command, spec)
        line = _one_line(err)
        assert code == 2 and f"{where}: a path component of 3" in line, line


def test_a_path_over_the_system_limit_is_invalid(capsys, tmp_path, grpo):
    grpo["data"]["train"]["uri"] = "/".join(["d" * 200] * 25) + ".parquet"
    code, _, err = _cli(capsys, "validate", _write(tmp_path, grpo))
    assert code == 2 and "data.train.uri: a path of" in _one_line(err)


@pytest.mark.parametrize("engine, version", ENGINES)
@pytest.mark.parametrize("trick", ["through_a_file", "symlink_loop"])
def test_filesystem_errors_on_spec_paths_are_invalid_input_naming_the_field(
        capsys, tmp_path, grpo, engine, version, trick):
    if trick == "through_a_file":
        grpo["data"]["train"]["uri"] = "data/train.parquet/inner.parquet"
        reason = "Not a directory"
    else:
        (tmp_path / "loop").mkdir()
        (tmp_path / "loop" / "a").symlink_to("b")
        (tmp_path / "loop" / "b").symlink_to("a")
        grpo["data"]["train"]["uri"] = "loop/a/train.parquet"
        reason = "symbolic links"
    spec = _write(tmp_path, grpo)
    for command in ("check", "plan"):
        code, _, err = _cli(capsys, command, "--engine", engine, "--engine-version", version,
                            spec, *(["-o", tmp_path / "p.json"] if command == "plan" else []))
        line = _one_line(err)
        assert code == 2 and "data.train.uri: cannot use" in line and reason in line, line
        assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1E+999"])
def test_a_number_too_large_for_a_double_is_refused_at_load(capsys, tmp_path, grpo, literal):
    grpo["engine_options"] = {"verl": {"trainer.foo": 12345.5}}
    text = json.dumps(grpo).replace("12345.5", literal)
    spec = _write(tmp_path, text)
    for command in (["validate"], ["digest"], ["check", "--engine", "verl",
                                               "--engine-version", "0.9.1"],
                    ["plan", "--engine", "verl", "--engine-version", "0.9.1"]):
        code, _, err = _cli(capsys, *command, spec)
        line = _one_line(err)
        assert code == 2 and literal in line and "non-finite" in line, line


def test_non_finite_numbers_from_the_python_api_are_refused():
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.spec.files import parse_spec

    doc = json.loads((EXAMPLES / "grpo.json").read_text())
    doc["labels"] = {"x": float("inf")}
    with pytest.raises(InvalidInput, match=r"labels\.x: inf is not a finite number"):
        parse_spec(doc)


# -- a valid spec reported as an adapter bug ------------------------------------------------------
def test_two_leaves_verl_reads_from_one_key_are_a_refusal_naming_both(capsys, tmp_path, grpo):
    grpo["data"]["validation"]["prompt_field"] = "question"
    spec = _write(tmp_path, grpo)
    code, _, err = _cli(capsys, "plan", "--engine", "verl", "--engine-version", "0.9.1", spec)
    line = _one_line(err)
    assert code == 3 and "adapter" not in line, line
    assert "data.validation.prompt_field: verl reads one key, data.prompt_key, for both " \
           "data.train.prompt_field and data.validation.prompt_field" in line, line
    code, out, _ = _cli(capsys, "explain", "--engine", "verl", "--engine-version", "0.9.1",
                        "--json", spec)
    rows = {r["field"]: r for r in json.loads(out)["fields"]}
    assert rows["data.validation.prompt_field"]["state"] == "refused"
    assert rows["data.train.prompt_field"]["state"] == "pinned"


def test_two_rules_deriving_different_values_for_one_key_stay_an_adapter_bug():
    """Only leaves copied verbatim onto one key are the user's to reconcile; two rules that
    compute different values are the adapter's bug."""
    from stateset_backend.common.errors import AdapterBug
    from stateset_backend.plugin import external_rules
    from stateset_backend.spec.files import parse_spec
    from stateset_backend.translate.rules import Pinned, translate

    spec = parse_spec(json.loads((EXAMPLES / "grpo.json").read_text()))
    from stateset_backend.adapters.verl.adapter import VerlAdapter

    adapter = VerlAdapter()
    dialect = adapter.contract.dialect(__import__("packaging.version").version.Version("0.9.1"))
    rules = dict(adapter.rules(dialect))
    rules["seed"] = lambda v, s: Pinned({"data.prompt_key": "derived"})
    assert external_rules  # the kit every adapter builds on
    with pytest.raises(AdapterBug):
        translate(spec, rules, dialect, "verl", "0.9.1")


# -- smaller --------------------------------------------------------------------------------------
def test_a_newline_in_a_path_keeps_the_error_on_one_line(capsys, tmp_path, grpo):
    grpo["data"]["train"]["uri"] = "data/train.parquet/a\nb.parquet"
    code, _, err = _cli(capsys, "check", "--engine", "verl", "--engine-version", "0.9.1",
                        _write(tmp_path, grpo))
    line = _one_line(err)
    assert code == 2 and "a\\nb.parquet" in line, line


def test_any_error_message_is_printed_on_one_line(capsys, monkeypatch):
    from stateset_backend import cli
    from stateset_backend.common.errors import InvalidInput

    def fail(args):
        raise InvalidInput("first\nsecond\r\u2028third\x1b[31m\x85fourth\x9b31m")

    monkeypatch.setattr(cli, "build_parser", lambda command=None: type("P", (), {
        "parse_args": lambda self, raw: type("A", (), {"func": staticmethod(fail)})()})())
    assert cli.main(["validate", "x"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "first\\nsecond\\r\\u2028third\\x1b[31m\\x85fourth\\x9b31m" in line, line


@pytest.mark.parametrize("key", ["true", "True", "nan", "inf", "null", "NULL", "false"])
def test_mapping_keys_hydra_reads_as_another_type_are_refused(capsys, tmp_path, grpo, key):
    grpo["engine_options"] = {"verl": {"actor_rollout_ref.rollout.engine_kwargs.vllm": {
        "compilation_config": {key: 1}}}}
    code, err, _ = _plan(capsys, tmp_path, grpo, "verl", "0.9.1")
    line = _one_line(err)
    assert code == 2 and f"vllm: {key!r}: Hydra reads this mapping key" in line, \
        line


@pytest.mark.parametrize("option, value, fragment", [
    ("--ds.packing_samples", "yes", "a switch (store_true): give true or false"),
    ("--ds.packing_samples", 1, "a switch (store_true)"),
    ("--vllm.gpu_memory_utilization", "small", "takes one float"),
    ("--vllm.gpu_memory_utilization", True, "takes one float"),
    ("--vllm.gpu_memory_utilization", None, "remove it to keep the engine's default"),
    ("--algo.advantage.is_correction_mode", "nope", "takes one str from"),
    ("--logger.wandb.projekt", "x", "has no option '--logger.wandb.projekt'; did you mean "
                                    "'--logger.wandb.project'?"),
])
def test_openrlhf_options_are_checked_against_the_release_parser(
        capsys, tmp_path, grpo, option, value, fragment):
    grpo["engine_options"] = {"openrlhf": {option: value}}
    code, err, _ = _plan(capsys, tmp_path, grpo, "openrlhf", "0.11.2")
    line = _one_line(err)
    assert code == 2 and f"engine_options.openrlhf.{option}: " in line and fragment in line, line


def test_openrlhf_options_of_the_right_kind_plan(capsys, tmp_path, grpo):
    grpo["engine_options"] = {"openrlhf": {"--ds.packing_samples": True,
                                           "--logger.wandb.project": "team"}}
    code, err, plan = _plan(capsys, tmp_path, grpo, "openrlhf", "0.11.2")
    assert code == 0, err
    assert "--ds.packing_samples" in plan["argv"]
    assert "--logger.wandb.project=team" in plan["argv"]


def test_openrlhf_lora_off_pins_target_modules_as_its_parser_reads_them(
        capsys, tmp_path, grpo):
    code, err, plan = _plan(capsys, tmp_path, grpo, "openrlhf", "0.11.2")
    assert code == 0, err
    assert plan["native"]["--ds.lora.target_modules"] == ["all-linear"]
    assert "--ds.lora.target_modules" in plan["argv"]


@pytest.mark.parametrize("where", ["option", "prompt_field"])
def test_a_value_openrlhf_would_read_as_the_end_of_options_is_refused(
        capsys, tmp_path, grpo, where):
    """argparse drops '--' even in '--flag=--': the value would be lost, so it is refused."""
    if where == "option":
        grpo["engine_options"] = {"openrlhf": {"--logger.wandb.project": "--"}}
    else:
        grpo["data"]["train"]["prompt_field"] = grpo["data"]["validation"]["prompt_field"] = "--"
    code, err, _ = _plan(capsys, tmp_path, grpo, "openrlhf", "0.11.2")
    line = _one_line(err)
    assert code == 2 and "the value '--' cannot reach OpenRLHF" in line, line
