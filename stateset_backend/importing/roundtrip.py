"""The imported spec's own launch, planned and read back: the proof half of the import.

The plan is made by the hub's own ``make_plan``, exactly as ``plan`` makes it, so the round
trip proves what would really launch. Two things stand between an imported spec and a plan
that are not the spec's fault: an ``engine_options`` entry the hub's guards refuse (it leaves
the spec, named not expressible with the guard's reason), and a data split that is not on this
machine where the launch needs its rows (a stand-in file of the rows the launch keeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput, StatesetError, Unsupported
from stateset_backend.common.jsonio import flatten, put
from stateset_backend.contracts.loader import parse_version
from stateset_backend.importing.solve import bare
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.execution import declared_inside, execution_defaults

PLACEHOLDER_SHA256 = "0" * 64


def plan_dropping(entry: Any, version: str, doc: dict[str, Any], base: Path,
                   fates: dict[str, tuple[str, str, str | None]], engine: str,
                   settings: dict[str, Any]) -> tuple[Any, dict[str, str]]:
    """The plan of the imported spec. An engine_options entry the hub's own guards refuse
    (a key it sets itself, a value the release's parser would refuse) leaves the spec, and
    its setting is named not expressible with the guard's reason. A split that is not on this
    machine, where the launch needs its rows (an engine that sizes passes or validation from
    the data), is planned as a stand-in file of the rows the launch keeps; the stand-ins'
    paths are returned by split."""
    from stateset_backend.plan.launch_plan import make_plan

    options = dict(doc["engine_options"].get(engine, {}))
    stand_ins: dict[str, str] = {}
    reduced: set[str] = set()  # held mappings already cut to their declared parts
    for _ in range(2 * len(options) + 3):
        doc["engine_options"] = {engine: options} if options else {}
        planned = _with_stand_ins(doc, stand_ins)
        try:
            return make_plan(ExperimentSpec.model_validate(planned), entry, version,
                             base_dir=base), stand_ins
        except StatesetError as exc:
            prefix = f"engine_options.{engine}."
            # the guard names the option, or a key inside a mapping option (a requirement of
            # the attention kernel given inside verl's config overrides)
            culprit = next((k for k in options if exc.message.startswith(prefix + k + ":") or
                            exc.message.startswith(prefix + k + ".")), None)
            if culprit is not None:
                said = exc.message.removeprefix(prefix + culprit)
                # the guard's words, or whole where they name a key inside the mapping
                reason = said[1:].strip() if said.startswith(":") else \
                    exc.message.removeprefix(prefix)
                value = options.pop(culprit)
                kept = None if culprit in reduced else \
                    _declared_parts(entry, version, culprit, value)
                if kept and kept[1]:  # a held mapping: its declared parts stay, once
                    options[culprit] = kept[0]
                    reduced.add(culprit)
                    fates.update({key: ("not_expressible", reason, None) for key in kept[1]})
                else:  # refused whole, or again once cut: no part of it stays
                    fates[culprit] = ("not_expressible", reason, None)
                continue
            missing = _missing_split(doc, stand_ins, base, exc.message)
            if missing is None:
                raise
            stand_ins[missing] = _stand_in_split(doc, settings, missing)
    raise InvalidInput("the imported spec cannot be planned")  # pragma: no cover


def _declared_parts(entry: Any, version: str, key: str,
                    value: Any) -> tuple[dict[str, Any], list[str]] | None:
    """Where ``value`` is a mapping the launch holds but for the execution defaults its
    release declares inside it (verl's model config overrides beside the attention kernel):
    (the mapping of those declared parts alone, the dotted keys of the rest), or None when it
    has no declared part. A launch that gives the attention kernel beside a config override
    keeps its kernel: the guard refuses the mapping whole, not the part it lets in."""
    if not isinstance(value, dict):
        return None
    dialect = entry.adapter.contract.dialect(parse_version(version))
    declared = declared_inside(key, execution_defaults(dialect))
    kept: dict[str, Any] = {}
    rest: list[str] = []
    for name, leaf in flatten(value, key).items():
        if any(name == d or name.startswith(d + ".") for d in declared):
            put(kept, name[len(key) + 1:], leaf)
        else:
            rest.append(name)
    return (kept, rest) if kept else None


def _missing_split(doc: dict[str, Any], stand_ins: dict[str, str], base: Path,
                   message: str) -> str | None:
    """The placeholder split the plan's error names (the one the launch needs rows of), or
    the first placeholder split when it names none: a stand-in of a split the launch does not
    count would be written, and counted on every plan, for nothing."""
    open_ = [name for name in ("train", "validation")
             if name not in stand_ins and _placeholder_split(doc, name, base)]
    named = [name for name in open_ if str(doc["data"][name].get("uri")) in message]
    return next(iter(named or open_), None)


def _placeholder_split(doc: dict[str, Any], name: str, base: Path) -> bool:
    split = doc["data"].get(name)
    return isinstance(split, dict) and split.get("sha256") == PLACEHOLDER_SHA256 and \
        not (base / str(split.get("uri"))).is_file()


def _remove(name: str) -> None:
    import contextlib
    import os

    with contextlib.suppress(OSError):
        os.unlink(name)


def _with_stand_ins(doc: dict[str, Any], stand_ins: dict[str, str]) -> dict[str, Any]:
    data = dict(doc["data"])
    for name, path in stand_ins.items():
        data[name] = {**data[name], "uri": path}
    return {**doc, "data": data}


def _stand_in_split(doc: dict[str, Any], settings: dict[str, Any], name: str) -> str:
    """A JSON lines file of empty rows, as many as the launch keeps of that split (or one
    pass of the budget, or one validation batch), kept for the life of the process."""
    import atexit
    import os
    import tempfile

    suffix = "max_samples" if name == "train" else "max_val_samples"
    kept = next((v for k, v in settings.items() if k.endswith(suffix)), None)
    budget = doc["budget"]
    rows = kept if isinstance(kept, int) and 0 < kept < 10_000_000 else \
        budget["prompts_per_update"] * (budget["total_updates"] if name == "train" else 1)
    handle, path = tempfile.mkstemp(prefix=f"stateset-import-{name}-", suffix=".jsonl")
    with os.fdopen(handle, "w") as out:
        out.write("{}\n" * rows)
    atexit.register(_remove, path)
    return path


def read_plan(engine: str, plan: Any, reader: Any) -> dict[str, Any]:
    if reader is None:
        raise Unsupported(f"{engine}'s plugin brings no launch reader, so the import cannot "
                          "read its plan back")
    try:
        return {bare(k): v for k, v in reader(plan).items()}
    except StatesetError:
        raise
    except Exception as exc:
        raise InvalidInput(f"the imported spec's launch cannot be read back: {exc}") from None
