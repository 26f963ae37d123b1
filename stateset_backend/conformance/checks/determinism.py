"""A plan depends on its spec and release alone: two plans of one spec are the same (up to
run id and time); planning changes neither the spec nor the spec's folder; the launchers a plan
writes compile. (Fresh interpreters under other hash seeds: ``interpreters``.)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

from stateset_backend.conformance.checks.planning import CheckFailed
from stateset_backend.conformance.samples import Sample, SampleFiles
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import EngineAdapter, LaunchContext
from stateset_backend.engines.registry import entry_of
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.rules import translate


def normalized(plan: LaunchPlan) -> str:
    """The plan as text with what differs between two plans of one spec taken out: its run
    id and creation time (and the digests and checksum that cover them)."""
    doc = plan.to_json()
    for key in ("created_at", "checksum", "binding_digest", "run_id"):
        doc.pop(key, None)
    return json.dumps(doc, sort_keys=True).replace(plan.run_id, "<run-id>")


def tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def check_deterministic_and_pure(adapter: EngineAdapter, version: str, sample: Sample,
                                 files: SampleFiles) -> None:
    spec = parse_spec(sample.doc)
    before_spec = copy.deepcopy(spec.model_dump(mode="json"))
    before_files = tree(files.root)
    entry = entry_of(adapter)
    dialect = adapter.contract.dialect(parse_version(version))
    first = make_plan(spec, entry, version, base_dir=files.root)
    second = make_plan(spec, entry, version, base_dir=files.root)
    if normalized(first) != normalized(second):
        a, b = normalized(first), normalized(second)
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
        raise CheckFailed(f"{sample.capability}: two plans of the same spec differ beyond run "
                          f"id and time: ...{a[max(0, at - 80):at + 80]}... vs "
                          f"...{b[max(0, at - 80):at + 80]}...")
    t1 = translate(spec, adapter.rules(dialect), dialect, adapter.name, version)
    t2 = translate(spec, adapter.rules(dialect), dialect, adapter.name, version)
    if t1.native != t2.native:
        raise CheckFailed(f"{sample.capability}: translation differs between two calls")
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, version, dialect,
                        str(files.root))
    if adapter.render(t1, spec, ctx) != adapter.render(t2, spec, ctx):
        raise CheckFailed(f"{sample.capability}: render differs between two calls")
    if spec.model_dump(mode="json") != before_spec:
        raise CheckFailed(f"{sample.capability}: planning changed the spec object")
    if tree(files.root) != before_files:
        raise CheckFailed(f"{sample.capability}: planning wrote into the spec's folder")
    check_launchers_compile(first, sample.capability)
    again = functools.partial(make_plan, spec, entry, version, base_dir=files.root)
    check_plan_ignores_environment(again, first, sample.capability)
    check_plan_ignores_working_folder(again, first, sample.capability)


def check_plan_ignores_working_folder(plan_again: Callable[[], LaunchPlan], first: LaunchPlan,
                                      where: str) -> None:
    """Planned from another working folder, the plan is the same: the spec's relative paths
    point into the spec's folder (``ctx.base_dir``), not wherever the planning process
    happened to stand, which is another folder on the machine that runs the launch."""
    with tempfile.TemporaryDirectory(prefix="stateset-kit-cwd-") as elsewhere:
        here = Path.cwd()
        os.chdir(elsewhere)
        try:
            again = plan_again()
        finally:
            os.chdir(here)
    if normalized(again) != normalized(first):
        raise CheckFailed(f"{where}: planned from another working folder, the plan differs: "
                          "resolve the spec's relative paths against its folder "
                          "(ctx.base_dir), never the process's working folder")


class _Recording(MutableMapping[str, str]):
    """The process environment, recording every name read from it."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.real[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self.real

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self.real.get(key, default)

    def __setitem__(self, key: str, value: str) -> None:
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        del self.real[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)


@contextlib.contextmanager
def _environment_read() -> Iterator[set[str]]:
    """The names the code within reads from ``os.environ`` (and ``os.getenv``)."""
    real = os.environ
    recording = _Recording(real)
    # the module's mapping swapped for one that reads through to it (the environment itself
    # is untouched); os.getenv reads the module's name too
    setattr(os, "environ", recording)  # noqa: B010
    try:
        yield recording.read
    finally:
        setattr(os, "environ", real)  # noqa: B010


def check_plan_ignores_environment(plan_again: Callable[[], LaunchPlan], first: LaunchPlan,
                                   where: str) -> None:
    """A plan is the spec and the release, as text: planned again with each environment
    variable the planning read set to another value (or set, where it was unset), it is the
    same plan. A launch that takes a seed, a path or a key from the planning machine's
    environment runs another experiment than the one reviewed, on the machine that runs it."""
    with _environment_read() as read:
        plan_again()
    expected = normalized(first)
    for name in sorted(read):
        old = os.environ.get(name)
        os.environ[name] = "kit-probe" if old is None else f"{old}-kit-probe"
        try:
            again = plan_again()
        except Exception as exc:  # the variable decided whether it plans at all
            raise CheckFailed(f"{where}: with ${name} set otherwise the spec no longer plans "
                              f"({type(exc).__name__}: {exc}): a plan must not depend on the "
                              "planning machine's environment") from None
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
        if normalized(again) != expected:
            raise CheckFailed(f"{where}: the plan changes with ${name} on the planning "
                              "machine: a plan must be the spec and the release alone (the "
                              "engine's environment belongs in the launch's set_env)")


def check_launchers_compile(plan: LaunchPlan, where: str) -> None:
    """Every Python file the launch writes is a program Python can compile."""
    for name, text in plan.files.items():
        if name.endswith(".py"):
            try:
                compile(text, name, "exec")
            except SyntaxError as exc:
                raise CheckFailed(f"{where}: the launch writes {name}, which is not valid "
                                  f"Python (line {exc.lineno}: {exc.msg})") from None
