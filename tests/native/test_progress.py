"""One progress display per run: the live bar only for a person at a terminal, one line per
update for --json, logs and pipes, and no other library's bars in between."""

from __future__ import annotations

import io
import json
import sys

import pytest

from stateset_backend.native.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("asked, live", [("tty", True), ("lines", False), (None, True)])
def test_the_launchers_choice_wins_over_the_engines_own_stderr(monkeypatch, asked, live):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    if asked is None:
        monkeypatch.delenv("STATESET_BACKEND_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("STATESET_BACKEND_PROGRESS", asked)
    assert Progress(3).live is live


@pytest.mark.parametrize("json_flag, expected", [(False, "tty"), (True, "lines")])
def test_json_on_a_terminal_asks_the_engine_for_lines(monkeypatch, tmp_path, json_flag,
                                                      expected):
    """What `run --json` on a terminal hands the engine (the CLI passes live_progress)."""
    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.conformance.specs import MINIMAL
    from stateset_backend.engines.registry import AdapterEntry
    from stateset_backend.plan.launch_plan import make_plan
    from stateset_backend.runs.runner import prepare_attempt
    from stateset_backend.runs.store import Attempt
    from stateset_backend.spec.files import parse_spec

    plan = make_plan(parse_spec(MINIMAL), AdapterEntry(NativeAdapter(), "builtin",
                                                       "stateset-backend", "0.1.0"), "0.1.0")
    monkeypatch.setattr(sys, "stderr", _Terminal())
    (tmp_path / "1").mkdir()
    prepared = prepare_attempt(plan, NativeAdapter(), Attempt(plan.run_id, 1, tmp_path / "1"),
                               None, python=None, engine_home=None, echo_stderr=True,
                               live_progress=not json_flag)
    assert prepared.env["STATESET_BACKEND_PROGRESS"] == expected


def test_a_run_log_has_the_update_lines_and_no_library_bars(tmp_path, tiny, spec_file):
    from stateset_backend.cli import main

    plan, runs = tmp_path / "plan.json", tmp_path / "runs"
    assert main(["plan", "--engine", "native", str(spec_file(tiny())), "-o", str(plan)]) == 0
    assert main(["run", "--runs-dir", str(runs), "--quiet", str(plan)]) == 0
    run_id = json.loads(plan.read_text())["run_id"]
    log = (runs / run_id / "attempts" / "1" / "stderr.log").read_text()
    assert [line.split()[1] for line in log.splitlines() if line.startswith("update ")] == \
        [f"{n}/6" for n in range(1, 7)]
    assert "Writing model shards" not in log and "it/s]" not in log, log
