"""Interrupt a run at a known point, whatever the machine's speed.

Polling from outside for a checkpoint and then pressing Ctrl-C loses the race when the engine
finishes its next updates (and the retention policy removes that checkpoint) before the poll
looks again: on a fast machine the run simply succeeds. Instead the spec's reward parks the
engine, in its next reward call, once the checkpoint's manifest exists, and the test presses
Ctrl-C while it waits there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HOLD_WHEN = "STATESET_TEST_HOLD_WHEN"

_HOLD = f'''

_unheld_score = score


def score(prompt, response, answer):
    import os, pathlib, time
    hold = os.environ.get({HOLD_WHEN!r})
    if hold and pathlib.Path(hold).exists():
        time.sleep(600)  # until the test presses Ctrl-C
    return _unheld_score(prompt, response, answer)
'''


def write_holding_reward(path: Path, source: str) -> Path:
    """``source`` (a reward module defining ``score(prompt, response, answer)``) written to
    ``path``, its ``score`` wrapped to park while the file named by ``HOLD_WHEN`` exists."""
    path.write_text(source + _HOLD)
    return path


def interrupt_when(command: list[str], sealed: Path, timeout: float = 300) -> str:
    """Run ``stateset_backend COMMAND`` holding at its next reward call once ``sealed``
    exists, press Ctrl-C there, and return its stderr after it exits with 130."""
    proc = subprocess.Popen([sys.executable, "-m", "stateset_backend", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, HOLD_WHEN: str(sealed)})
    deadline = time.monotonic() + timeout
    while not sealed.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never sealed " + str(sealed)
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    return err
