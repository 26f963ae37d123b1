"""The CLI's data commands, as a user calls them."""

from __future__ import annotations

import json
import re

from stateset_backend.core.digest import experiment_digest
from stateset_backend.core.specfile import parse_spec


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
    minimal["rollout"] = {"backend": "vllm"}
    path = write_json(minimal)
    ok = cli("check", "--engine", "verl", "--engine-version", "0.9.1", "--json", path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    minimal["algorithm"] = {"objective": "gspo"}
    bad = cli("check", "--engine", "verl", "--engine-version", "0.5.0", "--json",
              write_json(minimal))
    assert bad.returncode == 3
    report = json.loads(bad.stdout.split("\n}\n")[0] + "\n}")
    assert {m["capability"] for m in report["missing"]} == {"objective:gspo", "ratio:sequence"}


def test_explain_covers_every_field(cli, write_json, minimal):
    proc = cli("explain", "--engine", "native", "--json", write_json(minimal))
    assert proc.returncode == 0, proc.stderr
    rows = {r["field"]: r for r in json.loads(proc.stdout)["fields"]}
    assert rows["algorithm.group_size"]["native"] == {"algorithm.group_size": 4}
    assert rows["labels"]["outcome"] == "not_applicable"
    assert all(r["outcome"] != "unmapped" for r in rows.values())
    table = cli("explain", "--engine", "native", write_json(minimal))
    assert table.returncode == 0 and "algorithm.clip.low" in table.stdout


def test_explain_names_rejections(cli, write_json, minimal):
    minimal["rollout"] = {"backend": "vllm"}
    proc = cli("explain", "--engine", "native", "--json", write_json(minimal))
    rows = {r["field"]: r for r in json.loads(proc.stdout)["fields"]}
    assert rows["rollout.backend"]["outcome"] == "rejected"
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
    assert verl["rollout.backend"]["outcome"] == "rejected"  # the spec asks for hf
    table = cli("explain", "--all-engines", write_json(minimal), env={"COLUMNS": "250"})
    assert table.returncode == 0 and "verl 0.9.1" in table.stdout


def test_explain_needs_one_engine_or_all(cli, write_json, minimal):
    proc = cli("explain", write_json(minimal))
    assert proc.returncode == 2 and "--engine E or --all-engines" in proc.stderr
