"""How the run store reads at a terminal: run ids and digests are what people copy from it, so
they are never wrapped or cut; a value that came from a user or an engine (a reason, a metric
name, a declared deviation) is elided past a stated length (common.display); ``--json`` has
everything the tables leave out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.cli.shared import rich_console
from stateset_backend.common.display import elided, elided_line

PAGE = 50  # runs a listing shows unless asked for more


def _page_title(noun: str, shown: int, doc: dict[str, Any]) -> str:
    """``N runs`` when the page holds them all, else which of them it holds."""
    total, limit, page = doc["total"], doc["limit"], doc["page"]
    if shown == total:
        return f"{total} {noun}"
    if not shown:
        pages = -(-total // limit) if limit else 1
        return f"no {noun} on page {page}: {total} make {pages} page(s) of {limit}"
    first = (page - 1) * (limit or 0) + 1
    return f"{noun} {first}-{first + shown - 1} of {total}, newest first"


def _more(noun: str, more: int, doc: dict[str, Any]) -> str | None:
    """The line under a page saying how many are left and the flag that shows them."""
    if not more:
        return None
    return (f"{more} more {noun}: --page {doc['page'] + 1} for the next "
            f"{min(more, doc['limit'])}, --all for all {doc['total']}")


def runs_table(doc: dict[str, Any]) -> None:
    """Run ids and digests are copied whole, so they never wrap; the digest shows its first
    12 hex digits, which every command taking a digest accepts as a prefix. One page of runs
    (``runs list --limit/--page/--all``), with a line saying how many more there are."""
    from rich import box
    from rich.table import Table

    rows = doc["runs"]
    console = rich_console()
    for key, title in (("in_flight", "in flight (no result yet)"),
                       ("abandoned", "abandoned (the job ended, its `run` was gone: no result)")):
        if not doc.get(key):
            continue
        flying = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
        for name in ("run", "attempt", "provider", "state"):
            flying.add_column(name, no_wrap=name != "state", overflow="fold")
        for r in doc[key]:
            job = f" job {r['job']}" if r["job"] else ""
            state = elided(r["reason"]) if key == "abandoned" else \
                r["state"] + (f" ({elided(r['reason'])})" if r["reason"] else "")
            flying.add_row(r["run_id"], f"#{r['attempt']}", f"{r['provider']}{job}", state)
        console.print(flying)
    if not rows and doc["total"]:  # past the last page
        console.print(_page_title("runs", 0, doc), markup=False)
        return
    t = Table(title=_page_title("runs", len(rows), doc), box=box.SIMPLE_HEAD, padding=(0, 1),
              pad_edge=False)
    t.add_column("run", no_wrap=True)
    t.add_column("engine", overflow="fold")
    t.add_column("status", overflow="fold")
    t.add_column("updates", no_wrap=True)
    t.add_column("digest", no_wrap=True)
    for r in rows:
        t.add_row(r["run_id"], elided(f"{r['engine']} {r['engine_version']}"),
                  f"{elided(str(r['status']))} #{r['attempt']}",
                  f"{r['committed_updates']}/{r['planned_updates']}",
                  r["experiment_digest"][7:19] or "?")
    console.print(t)
    more = _more("runs", doc["more"], doc)
    if more:
        console.print(more, markup=False)


def show_run(doc: dict[str, Any]) -> None:
    console = rich_console()
    # each digest on a line of its own: 71 characters fit 80 columns whole, so a terminal
    # never breaks one mid-hex and it is copied in one piece
    release = elided(f"{doc['engine']} {doc['engine_version']}")
    console.print(f"run {doc['run_id']}: {release}, seed {doc['seed']}\n  experiment\n"
                  f"    {doc['experiment_digest']}\n  binding\n    {doc['binding_digest']}\n"
                  f"  plan checksum\n    {doc['plan_checksum']}",
                  markup=False, soft_wrap=True)
    for d in doc["deviations"]:
        console.print(f"  declared {elided(d['setting'])}: {elided_line(d['description'])}",
                      markup=False)
    for a in doc["attempts"]:
        line = f"attempt {a['attempt']}: {a['status']}"
        if "committed_updates" in a:
            line += f", {a['committed_updates']}/{a['planned_updates']} updates"
        link = a.get("resumed_from")
        if link:
            line += f", resumed from attempt {link['attempt']} at update {link['update']}"
        console.print(line + (f" ({elided_line(a['reason'])})" if a.get("reason") else ""),
                      markup=False)
        sel = a.get("selection")
        if sel and sel.get("update") is None:
            console.print(f"  nothing recommended by {elided(sel['select_by'])}"
                          + (f": {elided_line(sel['reason'])}" if sel.get("reason") else ""),
                          markup=False)
        elif sel:
            console.print(f"  recommended by {elided(sel['select_by'])}: update {sel['update']}"
                          + (f" = {sel['value']:.4f}" if "value" in sel else
                             f" ({elided_line(str(sel.get('reason')))})")
                          + (f", attempts/{sel['attempt']}/{sel['checkpoint']}"
                             if sel.get("checkpoint") and isinstance(sel.get("attempt"), int)
                             else ""), markup=False)
        for ckpt in a.get("checkpoints", []):
            console.print(f"  {elided(ckpt['path'])}  sha256:{ckpt['sha256'][:16]}",
                          markup=False)
    for e in doc.get("evaluations", []):
        console.print(f"evaluated {e['split']} on attempt {e['attempt']} update {e['update']} "
                      f"({elided(str(e['checkpoint']))}): " + ", ".join(
                          f"{elided(k)} = {v:.4f}" for k, v in sorted(e["metrics"].items())),
                      markup=False)
    mark = doc.get("quarantine")
    if mark is not None:
        from stateset_backend.runs.quarantine import describe

        state = "QUARANTINED" if mark.get("quarantined", True) else \
            f"quarantine cleared {mark.get('cleared_at')} by `runs verify`, was"
        console.print(f"{state}: {elided_line(describe(mark))}", markup=False)


def compare_table(doc: dict[str, Any]) -> None:
    """One row per attempt, two lines each (run and engine; status and updates), so that the
    full run id, which users copy, fits an 80-column terminal beside the numbers; declared
    deviations, which can be long, are listed under the table."""
    from rich import box
    from rich.table import Table

    same = "one experiment" if doc["same_experiment"] else "DIFFERENT experiments"
    shown = max(0, doc["runs"] - (doc["page"] - 1) * (doc["limit"] or 0) - doc["more_runs"])
    page = "" if shown == doc["runs"] else \
        f" ({_page_title('runs', shown, {**doc, 'total': doc['runs']})})"
    t = Table(title=f"{same}: {', '.join(d[7:19] for d in doc['experiment_digests'])}{page}",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("run / engine", no_wrap=True)
    t.add_column("status", no_wrap=True)
    for col in ("reward", "val", "rec.", "test", "dev."):
        t.add_column(col, no_wrap=True, min_width=len(col))

    def num(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, int | float) else "-"

    def headline(e: dict[str, Any]) -> str:
        metrics = e["metrics"]
        name = next((k for k in ("test/reward/mean", "val/reward/mean", "test/loss", "val/loss")
                     if k in metrics), min(metrics, default=None))
        return f"{num(metrics.get(name)) if name else '-'}\n@{e['update']}"

    notes: list[str] = []
    for r in doc["attempts"]:
        final, rec = r.get("final", {}), r.get("recommended") or {}
        deviations = [d for d in r.get("deviations", []) if d]
        held_out = r.get("test", [])
        notes += [f"{r['run_id']}#{r['attempt']} {e['split']}@{e['update']} "
                  f"({elided(str(e['checkpoint']))}): " + ", ".join(
                      f"{elided(k)} {num(v)}" for k, v in sorted(e["metrics"].items()))
                  for e in held_out]
        notes += [f"{r['run_id']}#{r['attempt']} declares {elided_line(str(d))}"
                  for d in deviations]
        release = elided(f"{r.get('engine', '?')} {r.get('engine_version', '')}")
        t.add_row(f"{r['run_id']}#{r['attempt']}\n{release}",
                  f"{elided(str(r['status']))}\n{r.get('committed_updates', '-')}/"
                  f"{r.get('planned_updates', '-')}",
                  num(final.get("reward/mean")), num(final.get("val/reward/mean")),
                  f"{num(rec.get('value'))}\n@{rec['update']}"
                  if isinstance(rec.get("update"), int) else "-",
                  headline(held_out[-1]) if held_out else "-",
                  str(len(deviations)))
    console = rich_console()
    console.print(t)
    console.print("status: committed/planned updates; reward, val: final training and "
                  "validation reward; rec.: the value of evaluation.select_by at the update "
                  "it recommends; test: the newest held-out evaluation (all listed below); "
                  "dev.: declared deviations", markup=False)
    for note in notes:
        console.print(note, markup=False)
    more = _more("runs", doc["more_runs"], {**doc, "total": doc["runs"]})
    if more:
        console.print(more, markup=False)


def run_summary(result: Any, path: Path, runs_dir: str | None = None) -> str:
    """What `run` prints when an attempt succeeded: the few numbers a user looks at first,
    where the run is, and what to do next."""
    import shlex

    from stateset_backend.common.display import metric_text

    lines = [f"run {result.run_id} attempt {result.attempt} succeeded: "
             f"{result.committed_updates}/{result.planned_updates} updates committed in "
             f"{result.duration_s:.1f}s"]
    summary, initial = result.metrics.summary, result.metrics.initial
    for name in ("reward/mean", "val/reward/mean", "loss/policy", "kl", "loss/sft", "val/loss"):
        if summary.get(name) is not None:
            start = initial.get(name)
            was = f"{metric_text(start)} -> " if start is not None and start != summary[name] \
                else ""
            lines.append(f"  {name:16} {was}{metric_text(summary[name])}")
    lines.extend(f"  warning: {w}" for w in result.warnings)
    lines.append(f"  result: {path}")
    run = result.run_id + (f" --runs-dir {shlex.quote(runs_dir)}" if runs_dir else "")
    lines += ["next:",
              f"  stateset-backend runs show {run}",
              "      its attempts, checkpoints and the recommended checkpoint",
              f"  stateset-backend evaluate --split test {run}",
              "      the recommended checkpoint scored on the held-out test split",
              f"  stateset-backend report {run}",
              "      an HTML report with the curves (pip install 'stateset-backend[report]')"]
    return "\n".join(lines)
