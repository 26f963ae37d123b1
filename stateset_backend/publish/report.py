"""One self-contained HTML page per run or per experiment: what ran, whether it can be trusted,
and how its runs compare, readable offline and safe to mail around.

The page fetches nothing: the curves are matplotlib PNGs embedded as ``data:`` URIs, the CSS
is inline, and a Content-Security-Policy forbids every other source and every script, so a
string that slipped past escaping still could not run. Every string from a spec, a plan, an
engine or a file name goes through :func:`html.escape`. matplotlib is imported only here,
when a report is drawn.

Attempts are read back with :mod:`stateset_backend.runs.attempts`, as the MLflow export and
the attestation read them.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import Unsupported
from stateset_backend.common.jsonio import atomic_write_bytes, utc_now
from stateset_backend.runs.attempts import (
    AttemptRecord,
    evaluation_records,
    finite,
    load_target,
    read_series,
)
from stateset_backend.runs.store import RunStore

# Panels of the curves section: title and which canonical metrics it draws (a name ending in
# "/" takes every metric under it). Panels with no data are left out.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("reward/mean", "val/reward/mean")),
    ("Loss", ("loss/",)),
    ("KL", ("kl",)),
    ("Entropy", ("entropy",)),
    ("Response length", ("response_length/mean",)),
)


# -- drawing -----------------------------------------------------------------------------
def _panel_metrics(title_metrics: tuple[str, ...], names: Iterable[str]) -> list[str]:
    chosen = []
    for name in sorted(set(names)):
        if any(name == m or (m.endswith("/") and name.startswith(m)) for m in title_metrics):
            chosen.append(name)
    # the order the panel declares, then alphabetical within a prefix
    return sorted(chosen, key=lambda n: next(i for i, m in enumerate(title_metrics)
                                             if n == m or (m.endswith("/") and
                                                           n.startswith(m))))


def _points(rows: list[dict[str, Any]], metric: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        step, value = row.get("step"), row.get(metric)
        if isinstance(step, int) and not isinstance(step, bool) and \
                isinstance(value, int | float) and finite(value):
            steps.append(step)
            values.append(float(value))
    return steps, values


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def draw_curves(records: list[AttemptRecord], series: list[list[dict[str, Any]]],
                ) -> list[tuple[str, str, list[str]]]:
    """(panel title, PNG data URI, metrics drawn) for every panel that has data; runs are
    told apart by colour, metrics within a panel by line style."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise Unsupported("drawing a report needs matplotlib: pip install "
                          "'stateset-backend[report]'") from None
    names = {k for rows in series for row in rows for k in row}
    colours = [f"C{i % 10}" for i in range(len(records))]
    styles = ["-", "--", ":", "-."]
    panels = []
    for title, wanted in PANELS:
        metrics = _panel_metrics(wanted, names)
        if not metrics:
            continue
        # fixed margins: constrained layout would lay every figure out twice
        fig = Figure(figsize=(5.3, 3.0), dpi=100)
        fig.subplots_adjust(left=0.14, right=0.98, top=0.9, bottom=0.16)
        ax = fig.add_subplot()
        drawn = False
        for record, rows, colour in zip(records, series, colours, strict=True):
            for k, metric in enumerate(metrics):
                steps, values = _points(rows, metric)
                if not steps:
                    continue
                label = metric if len(records) == 1 else \
                    f"{record.result.engine} {record.run_id[-8:]}" + \
                    (f" {metric}" if len(metrics) > 1 else "")
                ax.plot(steps, values, color=colour, linestyle=styles[k % len(styles)],
                        marker="o" if len(steps) < 30 else None, markersize=3, label=label)
                drawn = True
        if not drawn:
            continue
        ax.set_title(title)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
        panels.append((title, _png(fig), metrics))
    return panels


# -- the page ----------------------------------------------------------------------------
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any) -> str:
    if finite(value):
        return f"{value:.6g}" if isinstance(value, float) else str(value)
    return _e(value if value is not None else "-")


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Cells are already HTML (escaped by the caller); the head is escaped here."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _code(value: Any) -> str:
    return f"<code>{_e(value)}</code>"


def _identity(records: list[AttemptRecord]) -> str:
    def row(label: str, cell: Any) -> list[str]:
        return [_e(label)] + [cell(r) for r in records]

    rows = [
        row("run", lambda r: _code(r.run_id)),
        row("attempt", lambda r: _e(r.result.attempt)),
        row("engine release", lambda r: _e(f"{r.result.engine} {r.result.engine_version}")),
        row("adapter", lambda r: _e("{distribution} {version}".format(
            **{"distribution": "?", "version": "", **(r.plan.get("adapter") or {})}))),
        row("provider", lambda r: _e(r.result.provider)),
        row("experiment digest", lambda r: _code(r.result.experiment_digest)),
        row("binding digest", lambda r: _code(r.result.binding_digest)),
        row("plan checksum", lambda r: _code(r.result.plan_checksum)),
        row("contract digest", lambda r: _code(r.plan.get("contract_digest"))),
        row("seed", lambda r: _e((r.plan.get("spec") or {}).get("seed"))),
        row("spec name", lambda r: _e((r.plan.get("spec") or {}).get("name"))),
        row("planned at", lambda r: _e(r.plan.get("created_at"))),
    ]
    out = [_table(["", *(f"run {i + 1}" for i in range(len(records)))], rows, "identity")]
    out.append("<h3>Declared deviations</h3>")
    for record in records:
        deviations = record.result.deviations
        title = f"<p>{_code(record.run_id)}: "
        if not deviations:
            out.append(title + "none declared; the engine ran the spec as written.</p>")
            continue
        out.append(title + f"{len(deviations)} declared</p>" + _table(
            ["setting", "deviation", "spec value", "engine value", "description"],
            [[_code(d.get("setting")), _e(d.get("deviation")),
              _code(json.dumps(d.get("spec_value"))), _code(json.dumps(d.get("engine_value"))),
              _e(d.get("description"))] for d in deviations]))
    return "\n".join(out)


def _status(records: list[AttemptRecord]) -> str:
    out = []
    for record in records:
        r = record.result
        out.append(f'<h3>{_code(r.run_id)} <span class="status {_e(r.status)}">'
                   f"{_e(r.status)}</span></h3>"
                   f"<p>attempt {_e(r.attempt)}, engine exit code {_num(r.exit_code)}, "
                   f"{_e(r.committed_updates)} of {_e(r.planned_updates)} updates committed in "
                   f"{_e(f'{r.duration_s:.1f}')} s ({_e(r.started_at)} to {_e(r.ended_at)})</p>")
        out.append(_table(["check", "outcome", "detail"], [
            [_e(c.name), '<span class="ok">passed</span>' if c.ok else
             '<span class="bad">failed</span>', _e(c.detail)] for c in r.checks]))
    return "\n".join(out)


def _curves(panels: list[tuple[str, str, list[str]]]) -> str:
    if not panels:
        return "<p>No reward, loss, KL, entropy or response-length metrics were reported.</p>"
    return "\n".join(
        f'<figure><img src="{p}" width="530" height="300" alt="{_e(title)}: '
        f'{_e(", ".join(metrics))}"><figcaption>{_e(title)}: {_e(", ".join(metrics))}'
        f"</figcaption></figure>" for title, p, metrics in panels)


def _validation(records: list[AttemptRecord], series: list[list[dict[str, Any]]]) -> str:
    out = []
    for record, rows in zip(records, series, strict=True):
        names = sorted({k for row in rows for k in row if k.startswith("val/")})
        validated = [row for row in rows if any(k in row for k in names)]
        head = f"<h3>{_code(record.run_id)}</h3>" if len(records) > 1 else ""
        if not validated:
            out.append(head + "<p>No validation metrics were reported.</p>")
            continue
        selected = (record.result.selection or {}).get("update")
        out.append(head + _table(["update", *names], [
            [_e(row.get("step")) + (" (recommended)" if row.get("step") == selected and
                                    selected is not None else "")]
            + [_num(row.get(n)) for n in names] for row in validated]))
    return "\n".join(out)


def _tests(records: list[AttemptRecord]) -> str:
    out = []
    for record in records:
        head = f"<h3>{_code(record.run_id)}</h3>" if len(records) > 1 else ""
        evaluations = evaluation_records(record)
        if not evaluations:
            out.append(head + "<p>No held-out test evaluation is recorded for this run "
                       f"(<code>stateset-backend evaluate {_e(record.run_id)} --split test"
                       "</code> makes one).</p>")
            continue
        rows = []
        for name, doc in evaluations:
            given = doc.get("metrics")
            metrics = given if isinstance(given, dict) else \
                {k: v for k, v in doc.items() if finite(v)}
            checkpoint = doc.get("checkpoint")
            if isinstance(checkpoint, dict):
                checkpoint = checkpoint.get("path") or checkpoint.get("update")
            rows.append([_e(name), _e(doc.get("split", "test")), _e(checkpoint),
                         "<br>".join(f"{_e(k)} = {_num(v)}" for k, v in sorted(metrics.items())
                                     ) or "-"])
        out.append(head + _table(["record", "split", "checkpoint", "metrics"], rows))
    return "\n".join(out)


def _checkpoints(records: list[AttemptRecord]) -> str:
    out = []
    for record in records:
        head = f"<h3>{_code(record.run_id)}</h3>" if len(records) > 1 else ""
        artifacts = sorted(record.result.artifacts,
                           key=lambda a: (a.kind != "checkpoint", a.step or 0, a.path))
        if not artifacts:
            out.append(head + "<p>No artifacts were recorded.</p>")
            continue
        sel = record.result.selection or {}
        chosen = sel.get("checkpoint") if sel.get("attempt", record.result.attempt) == \
            record.result.attempt else None  # one an earlier attempt wrote is not listed here
        out.append(head + _table(["path", "kind", "update", "bytes", "sha256"], [
            [_code(a.path) + (" <strong>recommended</strong>" if chosen and
                              a.path.startswith(f"{chosen}/") else ""),
             _e(a.kind), _num(a.step), _num(a.bytes), f'<code class="hash">{_e(a.sha256)}'
                                                      f"</code>"] for a in artifacts]))
    return "\n".join(out)


def _selection(records: list[AttemptRecord]) -> str:
    rows = []
    for record in records:
        sel = record.result.selection
        if sel is None:
            rows.append([_code(record.run_id), "-", "-", "-", "-",
                         "the spec names no evaluation.select_by"])
            continue
        rows.append([_code(record.run_id), _e(sel.get("select_by")), _e(sel.get("direction")),
                     _num(sel.get("update")), _num(sel.get("value")),
                     (_code(f"attempts/{sel['attempt']}/{sel['checkpoint']}")
                      if isinstance(sel.get("attempt"), int) else _code(sel["checkpoint"]))
                     if sel.get("checkpoint") else _e(sel.get("reason", ""))])
    return ("<p>The recommended checkpoint is the best validated update that has a checkpoint "
            "(the earlier update on a tie). It is a recommendation, never an approval, and the "
            "final checkpoint is not assumed to be the best.</p>" +
            _table(["run", "select by", "direction", "update", "value", "checkpoint"], rows))


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#1d1d1f;
padding:0 1em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
h3{font-size:1.05em}table{border-collapse:collapse;margin:.5em 0 1em;font-size:13px}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f6}code{font:12px ui-monospace,monospace;overflow-wrap:anywhere}
.hash{font-size:11px}.ok{color:#106b21}.bad{color:#b00020;font-weight:600}
.status{padding:.1em .5em;border-radius:.3em;background:#eee}
.status.succeeded{background:#d7f5dc}.status.failed,.status.invalid{background:#fbd8dc}
figure{display:inline-block;margin:.5em}figcaption{font-size:12px;color:#555}
"""
# Only inline styles and data: images may load; nothing else, no script, no form target.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")


def render(records: list[AttemptRecord], *, title: str, generated_at: str | None = None,
           skipped: list[str] | None = None) -> str:
    """The whole page as one string."""
    series = [read_series(r) for r in records]
    panels = draw_curves(records, series)
    generated = generated_at or utc_now()
    from stateset_backend import __version__

    sections = [("Identity", _identity(records)), ("Status and result checks", _status(records)),
                ("Curves", _curves(panels)), ("Validation", _validation(records, series)),
                ("Test", _tests(records)), ("Checkpoints and artifacts", _checkpoints(records)),
                ("Selection", _selection(records))]
    if skipped:
        sections.insert(0, ("Not shown", "<p>These runs of the experiment could not be read "
                                          "and are left out of this page:</p><ul>" + "".join(
                                              f"<li>{_e(line)}</li>" for line in skipped)
                            + "</ul>"))
    body = "\n".join(f'<section id="{_e(name.split()[0].lower())}"><h2>{_e(name)}</h2>\n'
                     f"{content}</section>" for name, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">\n'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n"
            f"<h1>{_e(title)}</h1>\n<p>Generated {_e(generated)} by stateset-backend "
            f"{_e(__version__)} from the run store; every value below is read from the plan "
            f"and result files of the runs.</p>\n{body}\n</body></html>\n")


def report(store: RunStore, target: str, output: str | Path | None = None,
           ) -> tuple[Path, list[AttemptRecord], list[str]]:
    """Write the report of a run (its newest attempt) or of every run of an experiment; the
    runs of it that could not be read are named on the page and returned."""
    kind, name = store.resolve(target)  # an id, a digest, or a unique prefix of either
    records, skipped = load_target(store, kind, name)
    spec_name = (records[0].plan.get("spec") or {}).get("name") or "experiment"
    title = f"{spec_name}: {len(records)} run(s) of experiment {name}" if kind == "digest" \
        else f"{spec_name}: run {name}"
    page = render(records, title=title, skipped=skipped)
    path = Path(output) if output else Path(f"report-{name.replace(':', '-')}.html")
    atomic_write_bytes(path, page.encode("utf-8"))
    return path, records, skipped
