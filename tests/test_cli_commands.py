"""The CLI's data commands, as a user calls them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.files import parse_spec


def test_validate_and_digest(cli, write_json, minimal):
    path = write_json(minimal)
    expected = experiment_digest(parse_spec(minimal))
    proc = cli("validate", path)
    assert proc.returncode == 0 and expected in proc.stdout
    proc = cli("digest", path)
    assert proc.returncode == 0 and re.fullmatch(r"sha256:[0-9a-f]{64}\n", proc.stdout)
    assert proc.stdout.strip() == expected
    assert json.loads(cli("digest", "--json", path).stdout) == {"experiment_digest": expected}


def test_check_exit_codes(cli, write_json, minimal):
    external = Path(__file__).parent.parent / "examples" / "external" / "grpo.json"
    ok = cli("check", "--engine", "verl", "--engine-version", "0.9.1", "--json", external)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    assert [d["deviation"] for d in json.loads(ok.stdout)["deviations"]] == \
        ["zero_variance_float_mean"]
    minimal["algorithm"] = {"objective": "gspo"}
    minimal["rollout"] = {"backend": "vllm"}
    bad = cli("check", "--engine", "verl", "--engine-version", "0.5.0", "--json",
              write_json(minimal))
    assert bad.returncode == 3
    report = json.loads(bad.stdout.split("\n}\n")[0] + "\n}")
    assert {m["capability"] for m in report["missing"]} == {"objective:gspo", "ratio:sequence"}


def test_check_answers_for_the_whole_plan_not_only_capabilities(cli, tmp_path):
    """Every capability present, yet the release cannot honour the spec: a deviation refused
    under equivalence: strict, a data file it cannot read. `check` says so, as `plan` would."""
    external = Path(__file__).parent.parent / "examples" / "external"
    doc = json.loads((external / "grpo.json").read_text())
    doc["equivalence"] = "strict"
    for split in ("train", "validation"):
        doc["data"][split]["uri"] = str(external / doc["data"][split]["uri"])
    strict = tmp_path / "strict.json"
    strict.write_text(json.dumps(doc))
    proc = cli("check", "--engine", "verl", "--engine-version", "0.9.1", strict)
    assert proc.returncode == 3
    assert "zero_variance_float_mean" in proc.stderr and "equivalence: strict" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_explain_covers_every_field(cli, write_json, minimal):
    proc = cli("explain", "--engine", "native", "--json", write_json(minimal))
    assert proc.returncode == 0, proc.stderr
    rows = {r["field"]: r for r in json.loads(proc.stdout)["fields"]}
    assert rows["algorithm.group_size"]["native"] == {"algorithm.group_size": 4}
    assert rows["labels"]["state"] == "not_applicable"
    assert {r["state"] for r in rows.values()} <= {"pinned", "inert", "not_applicable"}
    table = cli("explain", "--engine", "native", write_json(minimal))
    assert table.returncode == 0 and "algorithm.clip.low" in table.stdout


def test_explain_names_rejections(cli, write_json, minimal):
    minimal["rollout"] = {"backend": "vllm"}
    proc = cli("explain", "--engine", "native", "--json", write_json(minimal))
    rows = {r["field"]: r for r in json.loads(proc.stdout)["fields"]}
    assert rows["rollout.backend"]["state"] == "refused"
    assert "KV-cache" in rows["rollout.backend"]["reason"]


def test_help_lists_every_command(cli):
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("validate", "digest", "schema", "engines", "check", "explain", "plan",
                    "run"):
        assert command in proc.stdout


def test_explain_all_engines_side_by_side(cli, write_json, minimal):
    proc = cli("explain", "--all-engines", "--json", write_json(minimal))
    assert proc.returncode == 0, proc.stderr
    engines = {e["engine"]: e for e in json.loads(proc.stdout)["engines"]}
    assert {"native", "verl", "openrlhf", "nemo-rl"} <= set(engines)
    assert engines["verl"]["engine_version"] == "0.9.1"  # newest the contract names
    fields = [[r["field"] for r in e["fields"]] for e in engines.values()]
    assert all(f == fields[0] for f in fields)  # one row per field on every engine
    verl = {r["field"]: r for r in engines["verl"]["fields"]}
    assert verl["rollout.backend"]["state"] == "refused"  # the spec asks for hf
    table = cli("explain", "--all-engines", write_json(minimal), env={"COLUMNS": "250"})
    assert table.returncode == 0 and "verl 0.9.1" in table.stdout
    assert "one table per engine" not in table.stdout
    narrow = cli("explain", "--all-engines", write_json(minimal), env={"COLUMNS": "80"})
    # narrower than prose side by side: the engines compared by state, and where the prose is
    assert narrow.returncode == 0, narrow.stderr
    assert max(map(len, narrow.stdout.splitlines())) <= 80
    for name in ("native", "verl 0.9.1", "openrlhf", "nemo-rl"):
        assert name in narrow.stdout
    assert "REFUSED" in narrow.stdout and "explain --engine ENGINE" in narrow.stdout
    # about two lines a field whatever the engines installed, never a block per engine
    assert len(narrow.stdout.splitlines()) < 3 * len(fields[0])


def test_explain_needs_one_engine_or_all(cli, write_json, minimal):
    proc = cli("explain", write_json(minimal))
    assert proc.returncode == 2 and "--engine E or --all-engines" in proc.stderr


def _effective(cli, path, *extra):
    proc = cli("explain", "--all-engines", "--effective", "--json", *extra, path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_effective_table_states_every_setting_on_every_engine(cli, write_json, minimal):
    minimal["rollout"] = {"backend": "vllm"}
    table = _effective(cli, write_json(minimal))
    engines = [e["engine"] for e in table["engines"]]
    assert {"native", "verl", "openrlhf", "nemo-rl"} <= set(engines)
    states = {"same", "pinned", "declared", "refused", "inert", "not_applicable"}
    for row in table["rows"]:
        assert set(row["cells"]) == set(engines)
        assert {c["state"] for c in row["cells"].values()} <= states, row
    rows = {r["field"]: r for r in table["rows"]}
    # OpenRLHF defaults to betas (0.9, 0.95): the launch pins the spec's (0.9, 0.999)
    betas = rows["optim.betas"]["cells"]["openrlhf"]
    assert betas["state"] == "pinned" and betas["effective"] == [0.9, 0.999]


def test_differs_keeps_only_rows_that_are_not_the_same_everywhere(cli, write_json, minimal):
    minimal["rollout"] = {"backend": "vllm"}
    path = write_json(minimal)
    full, differs = _effective(cli, path), _effective(cli, path, "--differs")
    assert 0 < len(differs["rows"]) < len(full["rows"])
    # a setting one engine pins and the others already default to runs the same everywhere
    shown = {r["field"] for r in differs["rows"]}
    assert "optim.betas" not in shown
    for row in full["rows"]:
        states = {c["state"] for c in row["cells"].values()}
        assert (row["field"] in shown) == bool(states & {"declared", "refused"}), row
    for row in differs["rows"]:
        assert not row["same_everywhere"]
        # never an unstated difference: every cell is same, pinned, declared or refused
        for cell in row["cells"].values():
            assert cell["state"] in ("same", "pinned", "declared", "refused", "inert",
                                     "not_applicable")
            if cell["state"] in ("declared", "refused"):
                assert cell["reason"]


def test_effective_table_fits_80_columns(cli, write_json, minimal):
    minimal["rollout"] = {"backend": "vllm"}
    proc = cli("explain", "--all-engines", "--effective", "--differs", write_json(minimal),
               env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert max(len(line.encode()) for line in proc.stdout.splitlines()) <= 80, proc.stdout
    text = " ".join(proc.stdout.split())
    assert "-: inert, the spec makes the setting moot" in text  # every state is defined
    assert "settings differ between engines" in text


def test_explain_tables_show_user_strings_as_written(cli, write_json, minimal):
    """A spec's strings are data: square brackets in a name are printed, never read as the
    table library's markup, in the effective table and in the prose side by side."""
    minimal["name"] = "grpo-[bold]run[/]-[red]"
    path = write_json(minimal)
    for extra, columns in ((["--effective"], "80"), ([], "250"), ([], "80")):
        proc = cli("explain", "--all-engines", *extra, path, env={"COLUMNS": columns})
        assert proc.returncode == 0, proc.stderr
        assert "grpo-[bold]run[/]-[red]" in "".join(proc.stdout.split()), (extra, columns)


def test_effective_needs_all_engines(cli, write_json, minimal):
    proc = cli("explain", "--engine", "verl", "--effective", write_json(minimal))
    assert proc.returncode == 2 and "--all-engines" in proc.stderr


def test_engines_says_what_each_engine_can_do(cli):
    """By family at the installed (or newest known) release, and what newer releases add;
    not a count of capabilities per repeated version range."""
    proc = cli("engines", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    verl = text[text.index("verl 0.9.1 (newest known; not installed): "):]
    assert "objective cispo, dapo, dr_grpo, grpo, gspo, ppo, reinforce_pp, rloo;" in verl
    assert "kl_estimator k1, k2, k3;" in verl and "also checkpoint, critic," in verl
