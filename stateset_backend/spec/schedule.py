"""The learning rate the spec asks for at each update (``optim``: lr, warmup_steps, schedule,
min_lr_ratio), as a function of the spec alone.

It is the spec's meaning, not an engine's: the native engine's scheduler runs it, each adapter
pins its engine's scheduler to it, and a rehearsal holds the learning rate an engine logs to
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stateset_backend.spec.model import Optim

# The canonical metric ``lr`` is the rate an update ran at. An engine that steps its scheduler
# before it logs the rate reports, at update u, the rate update u + 1 will run at: it is
# collected as ``lr/next`` and never as ``lr``, so a run's learning-rate curve is never one
# update ahead of another engine's under the same name.
NEXT_LR = "lr/next"

# LR decay after warmup, as a function of progress in [0, 1] and the floor ratio
SCHEDULES: dict[str, Callable[[float, float], float]] = {
    "constant": lambda progress, floor: 1.0,
    # verl's get_cosine_schedule_with_warmup (half a cosine), floored at min_lr_ratio
    "cosine": lambda progress, floor: max(floor, math.cos(math.pi * progress) * (1 - floor) * 0.5
                                          + (1 + floor) * 0.5),
    "linear": lambda progress, floor: floor + (1 - floor) * (1 - progress),
}


def lr_factor(update: int, *, schedule: str, warmup: int, total: int,
              min_lr_ratio: float, warmup_start: float | None = None) -> float:
    """LR multiplier at update ``update`` (0-based): s + (1 - s) * u/W during warmup, s =
    ``warmup_start`` or 0 (the first update runs at lr 0 when W > 0, as in verl and Hugging
    Face; NeMo RL's recipes start from 0.1), then the schedule's decay from update W to
    ``total``."""
    if update < warmup:
        start = warmup_start or 0.0
        return start + (1.0 - start) * update / warmup
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    return SCHEDULES[schedule](progress, min_lr_ratio)


def lr_at(optim: Optim, update: int, total: int) -> float:
    """The learning rate update ``update`` (1-based, as metrics count) runs at."""
    return optim.lr * lr_factor(update - 1, schedule=optim.schedule, warmup=optim.warmup_steps,
                                total=total, min_lr_ratio=optim.min_lr_ratio,
                                warmup_start=optim.warmup_start_ratio)


def lr_within(optim: Optim, update: int, total: int, steps: int = 1) -> list[float]:
    """The rates update ``update``'s ``steps`` optimizer steps run at under the spec's schedule
    advanced once per optimizer step (warmup and decay over ``steps`` times as many steps), the
    deviation an engine whose scheduler steps with its optimizer declares; one step an update
    is ``lr_at`` itself."""
    first = (update - 1) * steps
    return [optim.lr * lr_factor(first + i, schedule=optim.schedule,
                                 warmup=optim.warmup_steps * steps, total=total * steps,
                                 min_lr_ratio=optim.min_lr_ratio,
                                 warmup_start=optim.warmup_start_ratio) for i in range(steps)]
