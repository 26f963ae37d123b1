"""What ``explain`` prints for a person, kept apart from what it computes so that ``--json``
and the tables read the same columns: prose outcomes side by side where the terminal is wide
enough (else the effective table), and the effective table, which fits 80 columns with any
number of engines. A value is drawn elided past a stated length (common.display), so a
million-character revision is a line, not megabytes; ``--json`` keeps it whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateset_backend.cli.shared import rich_console
from stateset_backend.common.display import elided, elided_json, elided_line


def print_side_by_side(engines: list[dict[str, Any]], effective: Callable[[], dict[str, Any]],
                       spec: str) -> None:
    """Side by side where the terminal is wide enough to read prose in every column (about
    30 characters each). Narrower, several engines are compared in the effective table, which
    fits 80 columns with any number of them, and the screen says how to read one engine's
    prose: five prose tables one under the other would run to some 1,700 lines."""
    from rich.table import Table
    from rich.text import Text

    console = rich_console()
    wide = 30 * (2 + len(engines))
    if len(engines) > 1 and console.width < wide:
        print_effective(effective(), differs=False)
        console.print(f"at {console.width} columns the engines are compared by state; what "
                      "each one's launch sets, and why: stateset-backend explain --engine "
                      f"ENGINE {spec} (or a terminal at least {wide} columns wide)",
                      markup=False)
        return
    t = Table(title=", ".join(map(_release, engines)))
    t.add_column("field", overflow="fold")
    t.add_column("value", overflow="fold")
    for e in engines:
        t.add_column(_release(e), overflow="fold")
    for i, row in enumerate(engines[0]["fields"]):
        # Text, not markup: a value or reason holding "[...]" is shown as it is
        t.add_row(Text(elided(row["field"])), Text(elided_json(row["value"])),
                  *(Text(_outcome_text(e["fields"][i])) for e in engines))
    console.print(t)


def _release(e: dict[str, Any]) -> str:
    return elided(f"{e['engine']} {e['engine_version']}")


def _outcome_text(row: dict[str, Any]) -> str:
    state = row["state"]
    if state == "pinned" and row.get("native"):
        text = ", ".join(f"{elided(k)} = {elided_json(v)}" for k, v in row["native"].items())
        return text + (f" ({elided_line(row['reason'])})" if row.get("reason") else "")
    if state == "declared":
        return (f"declared {elided(str(row['deviation']))}: {elided_json(row['effective'])}: "
                f"{elided_line(row['reason'])}")
    return f"{state.replace('_', ' ')}: {elided_line(row.get('reason', ''))}".rstrip(": ")


_CELL = {"same": "same", "pinned": "pinned", "declared": "DECL", "refused": "REFUSED",
         "inert": "-", "not_applicable": "-"}
# what each state means, under every effective table: a reader should never have to guess
_LEGEND = ("same: the engine's default already is the spec's value; pinned: the launch sets "
           "it; DECL n: the engine does something else, named and quantified in note n; "
           "REFUSED n: the engine cannot, nothing launches (note n); -: inert, the spec makes "
           "the setting moot (for example validation decoding when nothing validates)")


# between two engines' states: the padding rich puts between two columns of this table
_GAP = "  "


def _ascii_head() -> Any:
    """The rule under a table's header in ASCII: as many bytes as columns in a log or pipe."""
    from rich import box

    return box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def print_effective(table: dict[str, Any], differs: bool) -> None:
    """At most 80 columns: one short state per engine, settings grouped under their section
    with the spec's value beside them; the values and reasons of declared and refused cells
    go in numbered notes under the table."""
    from rich.table import Table
    from rich.text import Text

    engines = [e["engine"] for e in table["engines"]]
    width = max(7, *(len(name) for name in engines))
    t = Table(box=_ascii_head(), pad_edge=False, collapse_padding=True,
              title=", ".join(map(_release, table["engines"])))
    t.add_column("setting = spec value", overflow="fold", ratio=1)
    # The engines' states are one block of fixed-width fields: drawn as one column of plain
    # Text, rich lays out two cells a row instead of one per engine, which is most of the
    # command's own time with five engines (the output is the same, byte for byte).
    t.add_column(_GAP.join(f"{name:<{width}}" for name in engines),
                 width=len(engines) * (width + len(_GAP)) - len(_GAP), no_wrap=True)
    notes: list[str] = []
    section = None
    for row in table["rows"]:
        if differs and row["same_everywhere"]:
            continue
        head, _, rest = row["field"].partition(".")
        if rest and head != section:
            t.add_row(Text(elided(head), style="bold"), "")
        section = head if rest else None
        cells = []
        for name in engines:
            cell = row["cells"][name]
            text = _CELL[cell["state"]]
            if cell["state"] in ("declared", "refused"):
                notes.append(f"{elided(row['field'])} on {name}: " + (
                    f"{elided_json(cell['effective'])} ({elided_line(cell['reason'])})"
                    if cell["state"] == "declared" else elided_line(cell["reason"])))
                text = f"{text[:width - 4]} {len(notes)}"
            cells.append(f"{text:<{width}}")
        label = f"  {elided(rest)}" if rest else elided(head)
        t.add_row(Text(f"{label} = {elided_json(row['value'])}"), Text(_GAP.join(cells)))
    console = rich_console()
    console.print(t)
    for i, note in enumerate(notes, 1):
        console.print(f"{i}. {note}", markup=False)
    for name in engines:
        tally = table["counts"][name]
        console.print(f"{name}: " + ", ".join(
            f"{tally.get(state, 0)} {state}" for state in
            ("same", "pinned", "declared", "refused", "inert")), markup=False)
    shown = sum(1 for r in table["rows"] if not (differs and r["same_everywhere"]))
    if differs:
        total = sum(table["counts"][engines[0]].values())
        console.print(f"{shown} of {total} settings differ between engines (a "
                      "declared deviation or a refusal); the others run as the spec says "
                      "everywhere", markup=False)
    console.print(_LEGEND, markup=False)


def print_upgrade(doc: dict[str, Any]) -> None:
    """One block per kind of change, each line a setting: what it was, what it becomes."""
    console = rich_console()

    def say(text: str) -> None:
        console.print(elided_line(text), markup=False, highlight=False)

    say(f"{doc['engine']} {doc['from']} -> {doc['to']} (dialect {doc['dialects']['from']} -> "
        f"{doc['dialects']['to']})")
    if doc["settings"]:
        say(f"\nsettings that change ({len(doc['settings'])}):")
    for s in doc["settings"]:
        a, b = s["before"] or {}, s["after"] or {}
        say(f"  {s['field']}: {', '.join(s['changes'])}")
        for label, side in (("before", a), ("after", b)):
            if not side:
                continue
            keys = ", ".join(f"{k}={elided_json(v)}" for k, v in side.get("native", {}).items())
            extra = side.get("deviation") or side.get("reason") or ""
            say(f"    {label}: {side['state']}" + (f" {keys}" if keys else "") +
                (f" ({elided(str(extra))})" if extra else ""))
    if doc["deviations"]:
        say(f"\ndeclared deviations ({len(doc['deviations'])}):")
        for d in doc["deviations"]:
            say(f"  {d['deviation']} ({d['setting']}): {d['what']}")
    if doc["defaults"]:
        say(f"\ndefaults that change ({len(doc['defaults'])}):")
        for d in doc["defaults"]:
            held = f" (the launch pins it: {d['pinned_by']})" if d["pinned_by"] else \
                " (the launch leaves it to the engine)"
            was = f" (was {d['was']})" if d.get("was") else ""
            say(f"  {d['key']}{was}: {elided_json(d['before'])} -> {elided_json(d['after'])}"
                f"{held}")
    if doc["no_longer_read"]:
        say(f"\nkeys the {doc['from']} launch sets that the {doc['to']} launch does not "
            f"({len(doc['no_longer_read'])}):")
        for d in doc["no_longer_read"]:
            say(f"  {d['key']} (from {d['set_by']}): {d['why']}")
    if doc["engine_options"]:
        say(f"\nengine_options ({len(doc['engine_options'])}):")
        for d in doc["engine_options"]:
            say(f"  {d['key']}: {d['why']}")
    if not any(doc[k] for k in ("settings", "deviations", "defaults", "no_longer_read",
                                "engine_options")):
        say("\nnothing this spec sets changes")
    say(f"\nexperiment digest: {'holds' if doc['digest_meaning_holds'] else 'changes meaning'}"
        f" - {doc['digest_meaning']}")
