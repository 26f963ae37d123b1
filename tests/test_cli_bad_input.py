"""Bad input: one clear line on stderr, the documented exit code, no traceback, nothing written."""

from __future__ import annotations

import json

import pytest


def _one_line_error(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("stateset-backend: error: ")
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("command", ["validate", "digest"])
def test_missing_file(cli, tmp_path, command):
    _one_line_error(cli(command, tmp_path / "nope.json"), 2, "no such spec")


def test_directory_instead_of_file(cli, tmp_path):
    _one_line_error(cli("validate", tmp_path), 2, "is a directory")


def test_empty_file(cli, write_json):
    _one_line_error(cli("validate", write_json("  \n")), 2, "is empty")


def test_invalid_json_gives_line_and_column(cli, write_json):
    path = write_json('{\n  "name": "x",\n  "seed": 1,,\n}')
    _one_line_error(cli("validate", path), 2, "invalid JSON at line 3, column 13")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_rejected(cli, write_json, minimal, literal):
    text = json.dumps(minimal).replace('"seed": 7', f'"seed": {literal}')
    _one_line_error(cli("validate", write_json(text)), 2, f"{literal} is not allowed")


def test_duplicate_keys_are_rejected(cli, write_json):
    _one_line_error(cli("validate", write_json('{"seed": 1, "seed": 2}')), 2,
                    "key 'seed' appears twice")


def test_wrong_types_each_named_by_path(cli, write_json, minimal):
    minimal["seed"] = "seven"
    minimal["algorithm"]["group_size"] = [4]
    proc = cli("validate", write_json(minimal))
    _one_line_error(proc, 2, "seed:", "algorithm.group_size:")


def test_json_mode_carries_every_problem(cli, write_json, minimal):
    minimal["algorithm"]["grup_size"] = 3
    proc = cli("validate", "--json", write_json(minimal))
    assert proc.returncode == 2
    problems = json.loads(proc.stdout)["error"]["details"]["problems"]
    assert problems == ["algorithm.grup_size: unknown key; did you mean 'group_size'?"]


def test_not_an_object(cli, write_json):
    _one_line_error(cli("validate", write_json("[1, 2]")), 2, "a spec is a JSON object")


def test_unknown_engine(cli, write_json, minimal):
    _one_line_error(cli("check", "--engine", "megatron", write_json(minimal)), 2,
                    "unknown engine 'megatron'")


def test_malformed_engine_version(cli, write_json, minimal):
    _one_line_error(cli("check", "--engine", "verl", "--engine-version", "newest",
                        write_json(minimal)), 2, "'newest' is not a PEP 440 version")


def test_engine_not_installed_says_how_to_install_it(cli, write_json, minimal):
    _one_line_error(cli("check", "--engine", "verl", write_json(minimal)), 3,
                    "verl is not installed in this Python environment; install it in its own "
                    "environment and point --python at it: python -m venv ~/.venvs/verl && "
                    "~/.venvs/verl/bin/pip install 'verl==")
    assert "or pass --engine-version V to plan for a machine that has it" in \
        cli("check", "--engine", "verl", write_json(minimal)).stderr


def test_run_without_the_engine_never_suggests_a_flag_run_cannot_use(cli, write_json,
                                                                      minimal):
    proc = cli("run", "--engine", "verl", write_json(minimal))
    _one_line_error(proc, 3, "then add --python ~/.venvs/verl/bin/python")
    assert "--engine-version" not in proc.stderr
    home = cli("run", "--engine", "nemo-rl", write_json(minimal))
    _one_line_error(home, 3, "nemo-rl is not installed in this Python environment; point "
                             "--engine-home at a nemo-rl source checkout")


def test_unknown_argument_is_one_line_with_exit_2(cli):
    _one_line_error(cli("digest", "--frobnicate", "x.json"), 2, "unrecognized arguments")


def test_unknown_command(cli):
    _one_line_error(cli("launch"), 2, "invalid choice")


@pytest.mark.parametrize("argv, line", [
    (["launch"], "stateset-backend: error: argument command: invalid choice: 'launch'"),
    (["validate"], "stateset-backend: error: validate: the following arguments are required"),
    (["runs", "show"], "stateset-backend: error: runs show: the following arguments are "
                       "required: run"),
])
def test_argument_errors_name_the_program_once(capsys, argv, line):
    from stateset_backend.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(line)


@pytest.mark.parametrize("argv", [["validate", "SPEC"], ["engines"], ["digest", "SPEC"],
                                  ["conformance", "native", "--engine-version", "0.1.0"]])
def test_json_before_the_subcommand_is_honoured(capsys, write_json, minimal, argv):
    from stateset_backend.cli import main

    spec = str(write_json(minimal))
    main(["--json", *[spec if a == "SPEC" else a for a in argv]])
    assert isinstance(json.loads(capsys.readouterr().out), dict)


def test_failed_plan_writes_nothing(cli, write_json, minimal, tmp_path):
    minimal["algorithm"] = {"objective": "cispo"}
    out = tmp_path / "plan.json"
    proc = cli("plan", "--engine", "verl", "--engine-version", "0.6.0", write_json(minimal),
               "-o", out)
    _one_line_error(proc, 3, "objective:cispo (available in verl >=0.7)")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [tmp_path / "spec.json"]


def test_debug_shows_the_traceback(cli, tmp_path):
    proc = cli("validate", "--debug", tmp_path / "nope.json")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def _in_process(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI's own main() in this interpreter: the same exit codes, without a process start."""
    from stateset_backend.cli import main

    code = main([*args])
    out, err = capsys.readouterr()
    return code, out, err


def _nested(depth: int) -> list:
    doc: list = []
    for _ in range(depth):
        doc = [doc]
    return doc


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.update(seed=2**53), "seed: integer outside"),
    (lambda d: d["budget"].update(total_updates=1e30), "budget.total_updates"),
    (lambda d: d.update(name="a\u0000b"), "name: contains the character U+0000"),
    (lambda d: d["model"].update(path="m\ud800"), "model.path: contains the character U+D800"),
    (lambda d: d["algorithm"].update(objective={"x": 1}), "algorithm.objective"),
    (lambda d: d.update(labels={"deep": _nested(40)}), "nested deeper than"),
])
def test_values_no_engine_can_carry_are_invalid_input(capsys, write_json, minimal, mutate,
                                                      fragment):
    mutate(minimal)
    path = write_json(json.dumps(minimal, ensure_ascii=True))
    for command in ("validate", "digest"):
        code, out, err = _in_process(capsys, command, "--json", str(path))
        assert code == 2 and fragment in err, err
        assert json.loads(out)["error"]["exit_code"] == 2


@pytest.mark.parametrize("command", [("schema", "spec"), ("engines",)])
def test_a_closed_pipe_ends_quietly(command):
    import subprocess
    import sys

    # The reader is gone before the first write: every write fails with EPIPE (a JSON print,
    # and a rich table, whose console would otherwise exit 1).
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.update(engine_options={"verl": {"trainer.wandb_api_key": "x"}}),
     "engine_options.verl.trainer.wandb_api_key: looks like a credential"),
    (lambda d: d.update(labels={"hf_token": "hf_abc"}), "labels.hf_token"),
    (lambda d: d["model"].update(path="https://user:pw@example.com/m"), "model.path: a URI"),
    (lambda d: d["data"]["train"].update(uri="s3://b/train.jsonl?X-Amz-Signature=abc"),
     "data.train.uri: a URI"),
    (lambda d: d.update(engine_options={"openrlhf": {"--x": {"password": "p"}}}),
     "engine_options.openrlhf.--x.password"),
])
def test_credentials_never_enter_a_spec(capsys, write_json, minimal, mutate, fragment):
    mutate(minimal)
    code, _, err = _in_process(capsys, "validate", str(write_json(minimal)))
    assert code == 2 and fragment in err, err
    assert "hf_abc" not in err and ":pw@" not in err  # the secret itself is never echoed


def test_token_counts_are_not_credentials(minimal):
    from stateset_backend.spec.files import parse_spec

    minimal["data"]["max_prompt_tokens"] = 64
    minimal["algorithm"] = {"objective": "dapo", "overlong": {"buffer_tokens": 8}}
    minimal["data"]["max_response_tokens"] = 64
    parse_spec(minimal)


@pytest.mark.parametrize("placeholder", ["{run_dir}", "{python}", "{engine_home}"])
def test_user_text_cannot_hold_a_launch_placeholder(capsys, write_json, minimal, placeholder):
    minimal["name"] = f"exp-{placeholder}"
    code, _, err = _in_process(capsys, "validate", str(write_json(minimal)))
    assert code == 2 and f"name: contains {placeholder}" in err


def test_the_refused_placeholders_are_the_launch_placeholders():
    from stateset_backend.engines.adapter import ENGINE_HOME, PYTHON, RUN_DIR
    from stateset_backend.spec.files import PLACEHOLDERS

    assert set(PLACEHOLDERS) == {RUN_DIR, PYTHON, ENGINE_HOME}


def test_an_unknown_builtin_model_is_invalid_at_plan_time(capsys, write_json, minimal):
    minimal["model"] = {"path": "builtin:nope"}
    minimal["data"]["chat_template"] = False
    code, _, err = _in_process(capsys, "plan", "--engine", "native", str(write_json(minimal)))
    assert code == 2 and "model.path: no built-in model 'nope'" in err, err


@pytest.mark.parametrize("objective", ["bogus", {"x": 1}, None])
def test_a_bad_objective_is_the_one_problem_reported(capsys, write_json, minimal, objective):
    from stateset_backend.cli import main

    minimal["algorithm"] = {"objective": objective} if objective is not None else {}
    assert main(["validate", str(write_json(minimal))]) == 2
    expected = "Field required" if objective is None else "Input should be 'grpo'"
    assert f"1 problem(s): algorithm.objective: {expected}" in capsys.readouterr().err


def _commands(parser: object) -> list[str]:
    import argparse

    sub = next(a for a in parser._actions  # type: ignore[attr-defined]
               if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_each_group_names_the_commands_it_adds():
    """The CLI builds only the group that owns the command it is given: each group's
    COMMANDS must be exactly what its add_parsers adds, and together every command."""
    from stateset_backend.cli import GROUPS, build_parser

    every = _commands(build_parser())
    assert [n for g in GROUPS for n in g.COMMANDS] == every
    for group in GROUPS:
        for name in group.COMMANDS:
            assert _commands(build_parser(name)) == list(group.COMMANDS)


@pytest.mark.parametrize("argv", [
    ["validate", "s.json"], ["--json", "digest", "s.json"], ["schema", "spec"],
    ["check", "--engine", "verl", "--engine-version", "0.9.1", "s.json"],
    ["explain", "--all-engines", "--effective", "--differs", "s.json"],
    ["run", "p.json", "--resume", "--runs-dir", "r"], ["runs", "list", "--limit", "5"],
    ["runs", "--json", "show", "abc"], ["evaluate", "--split", "test", "abc"],
    ["conformance", "native", "--json", "out.json"], ["--debug", "report", "abc", "-o", "x"]])
def test_a_command_parses_the_same_with_only_its_group(argv):
    from stateset_backend.cli import _command_word, build_parser

    assert vars(build_parser(_command_word(argv)).parse_args(argv)) == \
        vars(build_parser().parse_args(argv))


def test_invalid_json_names_the_fault_without_a_dangling_word(cli, write_json):
    """json's message for a raw control character ends in " at", before the place it adds."""
    path = write_json('{"name": "a\tb"}')
    _one_line_error(cli("validate", path), 2, "column 12: Invalid control character")
    assert "character at" not in cli("validate", path).stderr
