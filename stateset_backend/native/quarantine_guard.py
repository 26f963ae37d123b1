"""The engine's side of quarantine: the moment a state-changing step fails, say so on disk.

Three steps can leave state nobody can vouch for: a learner update that fails after at least
one optimizer step of it was applied (the weights are neither the old update's nor the new
one's), a checkpoint write that fails, and a restore that fails. Each runs inside
:func:`quarantine_on_failure`, which writes the attempt's marker before the error travels on,
so the core records the attempt as ``quarantined`` even though the process then dies. A user's
interrupt is not a fault and marks nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stateset_backend.runs import quarantine


class StepCounter:
    """Counts optimizer steps as they start, so a failure can tell whether any weight moved."""

    def __init__(self, optimizer: Any) -> None:
        self.started = 0
        optimizer.register_step_pre_hook(self._pre)

    def _pre(self, *_: Any) -> None:
        self.started += 1


@contextlib.contextmanager
def quarantine_on_failure(directory: Path, fault: quarantine.Fault, *, update: int | None,
                          changed: Callable[[], str | None] = lambda: "") -> Iterator[None]:
    """Mark ``directory`` quarantined if the block raises and ``changed()`` says what state
    moved (None: nothing moved, a plain failure)."""
    try:
        yield
    except Exception as exc:
        moved = None if peer_lost(exc) else changed()
        if moved is not None:
            reason = f"{type(exc).__name__}: {exc}" + (f" ({moved})" if moved else "")
            with contextlib.suppress(OSError):  # a full disk may refuse even the marker
                quarantine.mark(directory, fault=fault, reason=reason, update=update)
        raise


def peer_lost(exc: BaseException) -> bool:
    """A collective that failed because another rank died (killed, out of memory): the whole
    attempt fails (torchrun ends the group) and resumes from its last checkpoint; nothing of
    this rank's state was written, so it is a failure, not a quarantine."""
    from torch.distributed import DistError

    if isinstance(exc, DistError):
        return True
    text = str(exc)
    return ("gloo" in text and any(m in text for m in ("Read error", "Connection closed",
                                                        "Connection reset", "Timed out"))) \
        or "NCCL communicator was aborted" in text or "remote process exited" in text


def learner_update_guard(directory: Path, steps: StepCounter,
                         update: int) -> contextlib.AbstractContextManager[None]:
    """A learner update is part-way once one of its optimizer steps has started."""
    before = steps.started

    def changed() -> str | None:
        applied = steps.started - before
        return None if applied == 0 else \
            f"after {applied} optimizer step(s) of update {update} had started"

    return quarantine_on_failure(directory, "learner_update", update=update, changed=changed)
