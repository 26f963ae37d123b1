"""The spec counts its budget in updates; OpenRLHF counts passes over the data and steps its
scheduler once per optimizer step. The conversions between the two live here, shared by the
rules (warmup as a ratio of optimizer steps) and the launch (passes and rows kept, sized from
the train split when the launch is rendered).
"""

from __future__ import annotations

import math
from pathlib import Path

from stateset_backend.plugin import ExperimentSpec, Uncountable, Unsupported, split_rows


def optimizer_steps_per_update(spec: ExperimentSpec) -> int:
    return spec.budget.ppo_epochs * spec.budget.mini_batches


def warmup_ratio(warmup_updates: int, spec: ExperimentSpec) -> float:
    """A ratio OpenRLHF turns back into exactly warmup_updates * k optimizer steps: it computes
    ceil(total_steps * ratio), and W / T itself often lands one step high (7/25 * 25 > 7)."""
    k = optimizer_steps_per_update(spec)
    steps, total = warmup_updates * k, spec.budget.total_updates * k
    if steps == 0:
        return 0.0
    ratio = (steps - 0.5) / total
    assert math.ceil(total * ratio) == steps
    return ratio


def train_rows(spec: ExperimentSpec, base_dir: str | None) -> int:
    """OpenRLHF has no step limit, so the number of updates follows from the split's size."""
    try:
        return split_rows(spec.data.train.uri, Path(base_dir or "."))
    except Uncountable as exc:
        raise Unsupported(f"OpenRLHF has no step limit, so the launch sizes its passes over "
                          f"data.train from the split's row count, which cannot be counted: "
                          f"{exc}") from None


def passes(spec: ExperimentSpec, rows: int) -> tuple[int, int]:
    """(passes, rows kept) so that exactly total_updates whole updates run: each pass over the
    first U*B rows makes U updates, with U the largest divisor of T that fits in the split."""
    total, batch = spec.budget.total_updates, spec.budget.prompts_per_update
    fit = rows // batch
    if fit == 0:
        raise Unsupported(f"data.train has {rows} rows, fewer than one update's "
                          f"{batch} prompts (budget.prompts_per_update)")
    per_pass = max(u for u in range(1, min(fit, total) + 1) if total % u == 0)
    return total // per_pass, per_pass * batch
