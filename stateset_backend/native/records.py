"""The run's per-update records, written by one background thread in the order they were made.

Encoding an update's trajectories, metrics row and receipt as JSON, the TensorBoard scalars, the
progress record's rename and the progress line took a small model's update as long as a tenth
of its torch work, on the training thread. Handed to this writer, the file system's calls no
longer hold it up, and the Python runs whenever the training thread is inside one of torch's
kernels (which release the interpreter).

What the files say is unchanged: jobs run one at a time, in the order they were submitted, so
every file is written exactly as the training thread would have written it. What is deferred is
only when: :meth:`RecordWriter.flush` waits for everything submitted so far, and the trainer
calls it before a checkpoint is declared, before the durable progress record and at the end, so
a checkpoint never exists whose records are still in memory. The first job that fails stops the
ones after it (a later record must not land after a missing one), and its error is raised in the
training thread at the next submit, flush or close: it fails the run instead of vanishing.
"""

from __future__ import annotations

import json
import math
import queue
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Job = Callable[[], None]
_RESUME = threading.Event()  # queued when a failure has been raised: later jobs run again


class RecordWriter:
    """A single writer thread, started at the first job and stopped by :meth:`close` (a later
    job starts a new one: a trainer may train again after ``train(until=...)``)."""

    def __init__(self, name: str = "records") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Job | threading.Event | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # set by the thread, raised (once) here

    def submit(self, job: Job) -> None:
        """Run ``job`` after every job submitted before it. Raises a failed job's error."""
        self._raise_failure()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(job)

    def flush(self) -> None:
        """Wait until every job submitted so far has run; raise the first one's error."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done)
            done.wait()
        self._raise_failure()

    def close(self) -> None:
        """Flush, then stop the thread."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        error = self._error
        if error is not None:
            # every job submitted before this point is dropped; the ones after it run
            self._error = None
            self._queue.put(_RESUME)
            raise error

    def _run(self) -> None:
        skipping = False  # from a failed job until its error has been raised
        while True:
            item = self._queue.get()
            if item is None:
                return
            if item is _RESUME:
                skipping = False
            elif isinstance(item, threading.Event):
                item.set()
            elif not skipping:
                try:
                    item()
                except BaseException as exc:  # raised in the training thread, not here
                    skipping = True
                    self._error = exc


def append_line(path: Path, row: dict[str, Any]) -> None:
    """One JSON line appended to ``path``."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def write_lines(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """``path`` written as one JSON line per row."""
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


class ScalarLog:
    """TensorBoard event files beside ``metrics.jsonl``, so ``tensorboard --logdir runs/`` shows
    any native run. ``metrics.jsonl`` stays the source of truth (results and reports read it);
    the event files are a view of the same rows, written by TensorBoard's own writer and flushed
    by its background thread every second (not each update: a flush each update waited on that
    thread and cost a small model a tenth of its update), so a crashed run still shows its
    curves. They are not artifacts: nothing is hashed or checked from them."""

    def __init__(self, directory: Path) -> None:
        from torch.utils.tensorboard.writer import FileWriter

        # the event file SummaryWriter writes, written to directly (see write); a queue that
        # holds many rows: at its default of 10 events, each row waited on the writer thread
        self.writer = FileWriter(str(directory), max_queue=4096, flush_secs=1)

    def write(self, row: dict[str, Any]) -> None:
        """Every finite number of one metrics row at its ``step``, in one event: the values
        ``add_scalar`` writes one event each (a dozen events a row cost more than the row's
        other records together), read back alike by TensorBoard and ``read_scalars``."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=float(value))
                  for name, value in row.items()
                  if name != "step" and isinstance(value, int | float) and
                  not isinstance(value, bool) and math.isfinite(value)]
        if values:
            self.writer.add_summary(Summary(value=values), int(row["step"]))

    def close(self) -> None:
        self.writer.close()
