"""The main job as a user sees it: run in a real terminal (tmux) at 80x24 and 200x50, the
screen captured and read. Something is on screen at once; the live line never cuts a number;
the end says where the run is and what to do next; the log files hold no escape codes."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ESCAPE = re.compile(r"\x1b|\r")


@pytest.fixture
def terminal(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: apt-get install tmux (the terminal checks run the "
                    "main job inside it)")
    # tmux servers are machine-wide: the name is this process's own (tests run in parallel)
    socket = f"stateset-test-{os.getpid()}-{tmp_path.name}"

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], check=True, capture_output=True,
                              text=True).stdout

    yield tmux
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def _watch(tmux, cols: int, rows: int, command: str, deadline: float = 600):
    """Start ``command`` in a fresh cols x rows terminal; return (seconds until the screen
    first showed something, every distinct screen seen, the last screen)."""
    started = time.monotonic()
    tmux("new-session", "-d", "-x", str(cols), "-y", str(rows), "-s", "job",
         f"{command}; echo __EXIT=$?; sleep 600")
    first, screens = None, []
    while time.monotonic() - started < deadline:
        screen = tmux("capture-pane", "-p", "-t", "job")
        if first is None and screen.strip():
            first = time.monotonic() - started
        if not screens or screens[-1] != screen:
            screens.append(screen)
        if "__EXIT=" in screen:
            return first, screens, screen
        time.sleep(0.05)
    raise AssertionError(f"the job did not end in {deadline} s:\n{screens[-1]}")


def _job(tmp_path: Path, updates: int | None = None) -> tuple[str, Path]:
    home, spec = ROOT, Path("examples", "support-routing.json")
    if updates is not None:  # the same job, shorter, for the second terminal size: its spec
        # beside a copy of the example's data, outside the checkout
        doc = json.loads((home / spec).read_text())
        doc["budget"]["total_updates"] = updates
        doc["evaluation"]["every"] = 10
        doc["checkpoint"]["every"] = 10
        home, spec = tmp_path / "work", Path("examples", "support-routing-short.json")
        shutil.copytree(ROOT / "examples" / "support-routing",
                        home / "examples" / "support-routing")
        (home / spec).write_text(json.dumps(doc))
    runs = tmp_path / "runs"
    # as a user's shell starts it: the terminal's size comes from the terminal, not from a
    # COLUMNS this test process may have inherited
    command = (f"cd {shlex.quote(str(home))} && env -u COLUMNS -u LINES "
               f"{shlex.quote(sys.executable)} -m "
               f"stateset_backend run --engine native --runs-dir {shlex.quote(str(runs))} "
               f"{shlex.quote(str(spec))}")
    return command, runs


@pytest.mark.parametrize("cols, rows, updates", [(80, 24, None), (200, 50, 20)])
def test_the_main_job_reads_well_in_a_terminal(terminal, tmp_path, cols, rows, updates):
    command, runs = _job(tmp_path, updates)
    first, screens, last = _watch(terminal, cols, rows, command)
    assert "__EXIT=0" in last, last
    # something on screen at once, told by what the screens showed, not by a stopwatch (a
    # loaded machine stretches any bound): the first screen is the CLI's opening line, before
    # anything of the run, and the model load is announced before training shows a number
    shown = [screen for screen in screens if screen.strip()]
    assert first is not None and shown, "the screen stayed blank"
    assert "stateset-backend: checking" in shown[0] and "update " not in shown[0], shown[0]
    assert any("loading the model" in screen and "update " not in screen
               for screen in shown), "the model load was never announced before training"
    live = [line for screen in screens for line in screen.splitlines()
            if line.startswith("update ")]
    assert live, "no progress line was ever on screen"
    for line in live:  # nothing cut short: rich marks a cut with an ellipsis
        assert "…" not in line and len(line) <= cols, line
        assert "+0.0000" not in line and "-0.0000" not in line, line
    assert "ETA" in live[-1]
    (run_id,) = [p.name for p in runs.iterdir() if p.is_dir()]
    assert f"run {run_id} attempt 1 succeeded" in last
    assert f"stateset-backend runs show {run_id}" in last
    assert f"stateset-backend evaluate --split test {run_id}" in last
    assert f"stateset-backend report {run_id}" in last
    for log in (runs / run_id / "attempts" / "1").glob("*.log"):
        text = log.read_text()
        assert not ESCAPE.search(text), f"{log.name} holds terminal control codes"
    print(f"\n--- {cols}x{rows}, first output after {first:.2f} s, last screen:\n{last}")
