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


def read_hparams(log_dir: Path) -> dict[str, str | float | bool]:
    """Hyperparameters recorded with ``add_hparams`` under ``log_dir`` (e.g. a run's config)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    found: dict[str, str | float | bool] = {}
    for run_dir in sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(run_dir))
        acc.Reload()
        try:
            contents = acc.PluginTagToContent(metadata.PLUGIN_NAME)
        except KeyError:
            continue
        for raw in contents.values():
            data = plugin_data_pb2.HParamsPluginData.FromString(raw)
            if data.HasField("session_start_info"):
                for key, value in data.session_start_info.hparams.items():
                    kind = value.WhichOneof("kind")
                    found[key] = getattr(value, kind) if kind else ""
    return found


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
