"""Live progress of a training run: a rich bar on a terminal, one plain line per update in logs.

The engine's stderr reaches the user through the launcher, which decides:
``STATESET_BACKEND_PROGRESS=tty`` (the user's own stderr is a terminal) asks for the live bar,
``lines`` (``--json``, a log file, a pipe) for one line per update.
"""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType
from typing import Any

from stateset_backend.common.display import metric_text


class Progress:
    def __init__(self, total: int, start: int = 0, quiet: bool = False) -> None:
        self.total, self.done, self.t0, self.start = total, start, time.monotonic(), start
        self.quiet = quiet  # data parallel: only rank 0 reports
        asked = os.environ.get("STATESET_BACKEND_PROGRESS")  # tty | lines, from the launcher
        self.live = not quiet and (asked == "tty" or (asked is None and sys.stderr.isatty()))
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Progress:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            console = Console(stderr=True, force_terminal=True)
            # every number whole at 80 columns: the bar takes only the width the text leaves
            room = console.width - 80
            bar = [BarColumn(bar_width=min(room, 40))] if room >= 6 else []
            self._bar = RichProgress(
                TextColumn("update"), MofNCompleteColumn(), *bar,
                TextColumn("{task.fields[stats]}"), TextColumn("ETA"), TimeRemainingColumn(),
                console=console)
            self._bar.__enter__()
            self._task = self._bar.add_task("train", total=self.total, completed=self.done,
                                            stats="")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)

    @staticmethod
    def _stats(m: dict[str, Any]) -> str:
        """At most about 50 characters: reward and validation in [0, 1] at three decimals,
        loss and KL readable at any scale (never ``+0.0000`` for 3e-6)."""
        parts = [f"reward {m['reward/mean']:.3f}" if "reward/mean" in m else "",
                 f"loss {metric_text(m['loss/policy'], signed=True)}"
                 if "loss/policy" in m else "",
                 f"kl {metric_text(m['kl'])}" if "kl" in m else "",
                 f"val {m['val/reward/mean']:.3f}" if "val/reward/mean" in m else ""]
        return " ".join(p for p in parts if p)

    def advance(self, metrics: dict[str, Any]) -> None:
        self.done += 1
        if self.quiet:
            return
        stats = self._stats(metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, stats=stats)
            return
        rate = (self.done - self.start) / max(time.monotonic() - self.t0, 1e-9)
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        print(f"update {self.done}/{self.total}  {stats}  eta {eta:.0f}s", file=sys.stderr,
              flush=True)
