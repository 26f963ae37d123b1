"""A user's huge value never becomes a huge table or error line: tables and the one-line
error show a value's start, length and digest, an error lists its first problems and says how
many more there are, and ``--json`` still carries every problem and every value whole."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.common import display
from stateset_backend.common.display import (
    ERROR_CHARS,
    LINE_CHARS,
    PROBLEMS_SHOWN,
    VALUE_CHARS,
    VALUE_HEAD,
    elided,
    elided_line,
    problems_text,
)

ROOT = Path(__file__).resolve().parents[1]
MILLION = 1_000_000
# an error line holds its prefix, then at most ERROR_CHARS characters of message
ERROR_LINE_MAX = ERROR_CHARS + 100


def _cli(capsys, *args: Any) -> tuple[int, str, str]:
    from stateset_backend.cli import main

    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[:2000]
    assert lines[0].startswith("stateset-backend: error: ")
    return lines[0]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# -- the helper -----------------------------------------------------------------------------------
def test_a_short_value_is_shown_whole_and_a_long_one_by_start_length_and_digest():
    assert elided("a" * VALUE_CHARS) == "a" * VALUE_CHARS
    value = "b" + "a" * (MILLION - 1)
    shown = elided(value)
    assert shown == (f"'b{'a' * (VALUE_HEAD - 1)}…' (1,000,000 characters, "
                     f"sha256:{_sha(value)}…)")
    assert len(shown) < VALUE_CHARS


def test_a_long_line_keeps_its_start_and_end():
    line = "algorithm." + "x" * 200_000 + ": unknown key"
    shown = elided_line(line)
    assert len(shown) < LINE_CHARS + 100
    assert shown.startswith("algorithm.xxx") and shown.endswith("xx: unknown key")
    assert f"of {len(line):,} characters left out, sha256:{_sha(line)}…" in shown
    assert elided_line("short: message") == "short: message"


def test_problems_past_the_limit_are_counted_not_listed():
    problems = [f"p{i}: bad" for i in range(PROBLEMS_SHOWN + 7)]
    text = problems_text(problems)
    assert text.startswith("p0: bad; p1: bad")
    assert f"p{PROBLEMS_SHOWN - 1}: bad; and 7 more" in text and f"p{PROBLEMS_SHOWN}:" not in text
    assert problems_text(problems[:PROBLEMS_SHOWN]) == "; ".join(problems[:PROBLEMS_SHOWN])


def test_the_readme_states_the_limits_the_code_uses():
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for fact in (f"a value over {VALUE_CHARS} characters shows its first {VALUE_HEAD}",
                 f"over {LINE_CHARS} characters keeps its start and end",
                 f"its first {PROBLEMS_SHOWN} problems, then `and N more`",
                 f"stops at {ERROR_CHARS:,} characters", "`--json` keeps everything"):
        assert fact in readme, fact
    assert set(display.__dict__) >= {"VALUE_CHARS", "LINE_CHARS", "PROBLEMS_SHOWN"}


# -- explain --------------------------------------------------------------------------------------
@pytest.fixture
def huge_revision(write_json, minimal) -> tuple[Path, Path, str]:
    revision = "r" + "a" * (MILLION - 1)
    normal = write_json(minimal, "normal.json")
    minimal["model"]["revision"] = revision
    return normal, write_json(minimal, "huge.json"), revision


@pytest.mark.parametrize("how", [["--engine", "verl", "--engine-version", "0.9.1"],
                                 ["--all-engines"], ["--all-engines", "--effective"]])
def test_explain_of_a_million_character_revision_stays_a_small_table(capsys, huge_revision,
                                                                    how):
    normal, huge, revision = huge_revision
    code, usual, _ = _cli(capsys, "explain", *how, normal)
    assert code == 0
    code, out, err = _cli(capsys, "explain", *how, huge)
    assert code == 0, err
    # the long value costs a few lines over the usual table, never megabytes
    assert len(out) < min(len(usual) + 3000, 50_000), len(out)
    flat = re.sub(r"[\s│|]+", "", out)  # a narrow column folds the digest over lines
    assert "(1,000,000characters," in flat and f"sha256:{_sha(revision)}…" in flat, flat[:3000]


def test_explain_json_keeps_the_whole_value(capsys, huge_revision):
    _, huge, revision = huge_revision
    code, out, _ = _cli(capsys, "explain", "--json", "--engine", "verl", "--engine-version",
                        "0.9.1", huge)
    assert code == 0
    rows = {r["field"]: r for r in json.loads(out)["fields"]}
    assert rows["model.revision"]["value"] == revision


# -- validate -------------------------------------------------------------------------------------
def test_200000_unknown_keys_are_one_short_line_and_every_one_in_json(capsys, write_json,
                                                                     minimal):
    minimal["algorithm"].update({f"k{i}": 1 for i in range(200_000)})
    code, out, err = _cli(capsys, "validate", "--json", write_json(minimal))
    assert code == 2
    line = _error_line(err)
    assert len(line) < 2000, len(line)
    assert "200000 problem(s): algorithm.k0: unknown key;" in line
    assert line.endswith(f"; and {200_000 - PROBLEMS_SHOWN:,} more (--json lists every one)")
    problems = json.loads(out)["error"]["details"]["problems"]
    assert len(problems) == 200_000 and problems[-1] == "algorithm.k199999: unknown key"


def test_a_200000_character_key_is_elided_in_the_line_and_whole_in_json(capsys, write_json,
                                                                       minimal):
    key = "x" * 200_000
    minimal["algorithm"][key] = 1
    code, out, err = _cli(capsys, "validate", "--json", write_json(minimal))
    assert code == 2
    line = _error_line(err)
    assert len(line) < LINE_CHARS + 300 and line.endswith("xx: unknown key"), line
    assert "characters left out" in line
    assert json.loads(out)["error"]["details"]["problems"] == [f"algorithm.{key}: unknown key"]


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d, n: d.update(labels={f"l{i}": "a\u0000b" for i in range(n)}),
     "contains the character U+0000"),
    (lambda d, n: d.update(labels={f"hf_{i}_token": "x" for i in range(n)}),
     "looks like a credential"),
    (lambda d, n: d["algorithm"].update({f"k{i}": 1 for i in range(n)}), "unknown key"),
])
def test_every_kind_of_spec_problem_is_capped_the_same_way(capsys, write_json, minimal, mutate,
                                                           fragment):
    mutate(minimal, 25)
    code, out, err = _cli(capsys, "validate", "--json", write_json(minimal))
    line = _error_line(err)
    assert code == 2 and "25 problem(s)" in line and fragment in line
    assert line.endswith(f"; and {25 - PROBLEMS_SHOWN} more (--json lists every one)"), line
    assert line.count(fragment) == PROBLEMS_SHOWN
    assert len(json.loads(out)["error"]["details"]["problems"]) == 25


def test_a_value_with_a_million_forbidden_characters_is_one_short_line(capsys, write_json,
                                                                       minimal):
    minimal["labels"] = {"k" * MILLION: "\u0000"}
    code, _, err = _cli(capsys, "validate", write_json(minimal))
    line = _error_line(err)
    assert code == 2 and len(line) < LINE_CHARS + 300, len(line)


def test_any_error_message_is_bounded_on_stderr_and_whole_in_json(capsys, monkeypatch):
    from stateset_backend import cli
    from stateset_backend.common.errors import InvalidInput

    message = "refused: " + "v" * (5 * MILLION) + " (the end)"

    def fail(args):
        raise InvalidInput(message)

    monkeypatch.setattr(cli, "build_parser", lambda command=None: type("P", (), {
        "parse_args": lambda self, raw: type("A", (), {"func": staticmethod(fail)})()})())
    code, out, err = _cli(capsys, "validate", "--json", "x")
    line = _error_line(err)
    assert code == 2 and len(line) < ERROR_LINE_MAX, len(line)
    assert line.endswith("(the end)") and "stateset-backend: error: refused: vvv" in line
    assert json.loads(out)["error"]["message"] == message


def test_a_kuberay_setting_under_a_huge_key_is_named_briefly(capsys, tmp_path):
    spec = ROOT / "examples" / "support-routing.json"
    settings = tmp_path / "kuberay.json"
    settings.write_text(json.dumps({
        "image": "rayproject/ray:2.49.0", "volume": {"claim_name": "pvc", "mount_path": "/mnt"},
        "secrets": {"K" * 200_000: {"name": "s", "key": "k"}}}))
    code, _, err = _cli(capsys, "plan", "--engine", "native", "--provider", "kuberay",
                        "--kuberay-settings", settings, spec)
    line = _error_line(err)
    assert code == 2 and "kuberay settings: secrets.'KKK" in line and len(line) < 1000, line
    assert "(200,000 characters, sha256:" in line


# -- the run store's tables -----------------------------------------------------------------------
def _run_doc(long: str) -> dict[str, Any]:
    digest = "sha256:" + "0" * 64
    return {
        "run_id": "20260101T000000Z-00000000", "engine": "native", "engine_version": "0.1.0",
        "seed": 7, "experiment_digest": digest, "binding_digest": digest,
        "plan_checksum": digest,
        "deviations": [{"setting": "model.revision", "description": f"uses {long}"}],
        "attempts": [{"attempt": 1, "status": "failed", "reason": f"engine said {long}",
                      "selection": {"select_by": long, "update": None, "reason": long},
                      "checkpoints": [{"path": long, "sha256": "0" * 64}]}],
        "evaluations": [{"split": "test", "attempt": 1, "update": 2, "checkpoint": long,
                         "metrics": {long: 0.5}}],
    }


def test_show_run_bounds_every_value_from_the_spec_or_the_engine(capsys):
    from stateset_backend.cli.runs_tables import show_run

    long = "z" * MILLION
    show_run(_run_doc(long))
    out = capsys.readouterr().out
    assert len(out) < 10_000, len(out)
    assert out.count(f"sha256:{_sha(long)}…") >= 4


def test_compare_bounds_deviations_and_metric_names(capsys):
    from stateset_backend.cli.runs_tables import compare_table

    long = "q" * MILLION
    row = {"run_id": "20260101T000000Z-00000000", "attempt": 1, "engine": "native",
           "engine_version": "0.1.0", "status": "succeeded", "committed_updates": 2,
           "planned_updates": 2, "final": {}, "recommended": None,
           "deviations": [f"model.revision: {long}"],
           "test": [{"split": "test", "update": 2, "checkpoint": "final",
                     "metrics": {long: 0.5}}]}
    compare_table({"same_experiment": True, "runs": 1, "page": 1, "limit": 50, "more_runs": 0,
                   "experiment_digests": ["sha256:" + "0" * 64], "attempts": [row]})
    out = capsys.readouterr().out
    assert len(out) < 10_000, len(out)
    assert f"sha256:{_sha(long)}…" in out
