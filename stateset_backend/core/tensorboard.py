"""Reading scalar series from TensorBoard event files with TensorBoard's own reader.

OpenRLHF and NeMo RL report metrics only to TensorBoard (or W&B). The event format is
protobuf records with CRCs; the maintained reader handles it, so we never parse it by hand.
Imported only when such an engine's outputs are collected.
"""

from __future__ import annotations

from pathlib import Path


def read_scalars(log_dir: Path) -> dict[int, dict[str, float]]:
    """{step: {tag: value}} from every event file under ``log_dir`` (last write wins)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    rows: dict[int, dict[str, float]] = {}
    for run_dir in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for event in acc.Scalars(tag):
                rows.setdefault(int(event.step), {})[tag] = float(event.value)
    return rows


def canonical_rows(scalars: dict[int, dict[str, float]],
                   names: dict[str, str]) -> list[dict[str, float]]:
    """Rows of canonical metrics (``names``: canonical -> engine tag), in step order.

    Non-finite values are kept as they are, so the result check can see them.
    """
    out: list[dict[str, float]] = []
    for step in sorted(scalars):
        values = scalars[step]
        row: dict[str, float] = {"step": step}
        row.update({c: values[t] for c, t in names.items() if t in values})
        if len(row) > 1:
            out.append(row)
    return out


__all__ = ["canonical_rows", "read_scalars"]
