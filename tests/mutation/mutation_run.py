"""The conformance kit's mutation suite: each mutant (``mutants.py``) applied to a copy of the
package (or of the TRL plugin), the kit run on its engine through the CLI, killed when the kit
fails. Prints the kill rate per engine and every survivor.

    python tests/mutation/mutation_run.py [--jobs 2] [--only SUBSTRING] [--json OUT]
                                          [--no-hints | --write-first-kills]

A mutant is first run on the check that killed it last (``first_kills.json``): a failure there
is a kill as sound as any, and most mutants die in a few seconds instead of after every check
before it. A mutant that survives its check, or has none recorded, runs the whole kit.
``--write-first-kills`` runs every mutant on the whole kit and records the check that killed
each (the kit runs its checks in order and stops at the first failure).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the tree whose kit is measured: this checkout, or another (an earlier release) to compare
ROOT = Path(os.environ.get("STATESET_MUTATION_ROOT") or HERE.parents[1])
sys.path.insert(0, str(HERE))

from mutants import MUTANTS, Mutant  # noqa: E402
from zygote import TIMED_OUT  # noqa: E402

TRL_PLUGIN = ROOT / "examples" / "plugins" / "stateset-trl-engine"
FIRST_KILLS = HERE / "first_kills.json"
ENGINE_RUN = "engine_runs_as_the_spec_asks"  # the engine's own run of the watched sample


class StaleMutant(ValueError):
    """A mutant whose text is no longer in the file: the suite's definition needs updating."""


class KitDidNotFinish(RuntimeError):
    """The kit's run timed out or was killed: neither a kill nor a survival."""


def _copy(tmp: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "stateset_backend", tmp / "stateset_backend", ignore=ignore)
    shutil.copytree(TRL_PLUGIN / "stateset_trl_engine", tmp / "stateset_trl_engine",
                    ignore=ignore)


def apply(mutant: Mutant, tmp: Path) -> None:
    for rel, old, new in mutant.edits:
        path = tmp / rel
        text = path.read_text(encoding="utf-8")
        if old not in text:
            raise StaleMutant(f"{mutant.name}: {rel} no longer holds {old[:60]!r}")
        path.write_text(text.replace(old, new), encoding="utf-8")


def _other_plugins_off() -> list[str]:
    """``-p no:NAME`` for every installed pytest plugin but the kit's own: the kit's module
    uses none of them, and importing them (Hypothesis, Hydra's, with assertion rewriting of
    their packages) costs each mutant's run about a second."""
    from importlib.metadata import entry_points

    return [f"-p no:{ep.name}" for ep in entry_points(group="pytest11")
            if not ep.value.startswith("stateset_backend.")]


def first_kills() -> dict[str, str]:
    return json.loads(FIRST_KILLS.read_text()) if FIRST_KILLS.is_file() else {}


def _failed(check: str, code: int, reasons: list[str]) -> bool:
    """Whether the kit failed on ``check`` itself: a renamed check selects nothing, and
    pytest's "no tests ran" fails the kit without any check failing."""
    return code != 0 and any(r.split(":", 1)[0] == check for r in reasons)


def run_one(mutant: Mutant, zygote: Zygote, timeout: float = 600,
            first: str | None = None) -> dict[str, object]:
    """Apply one mutant to a fresh copy and run the kit (forked from ``zygote``); killed when
    it does not exit 0. With ``first`` (a check's name), that check runs first, the whole kit
    only if it passes."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="stateset-mutant-") as tmp_name:
        tmp = Path(tmp_name)
        _copy(tmp)
        apply(mutant, tmp)
        hinted = False
        if first:
            code, reasons = _kit(mutant, zygote, tmp, first, timeout)
            # killed by that check itself (``_failed``); a baseline of one check runs that
            # check alone
            hinted = mutant.kind == "baseline" or _failed(first, code, reasons)
        if not hinted:
            code, reasons = _kit(mutant, zygote, tmp, "", timeout)
            if code == 0 and mutant.kind == "launcher":  # code only the engine's run runs
                code, reasons = _kit(mutant, zygote, tmp, ENGINE_RUN, timeout)
                if code > 0 and not _failed(ENGINE_RUN, code, reasons):
                    code = 0
    if code < 0:  # a timeout or a signal says nothing of the mutant: an error, not a kill
        raise KitDidNotFinish(f"{mutant.name}: the kit " + (
            "ran past its timeout" if code == TIMED_OUT else f"was ended by signal {-code}"))
    return {"name": mutant.name, "engine": mutant.engine, "kind": mutant.kind,
            "killed": code != 0, "exit": code,
            "reasons": reasons[:3], "first": first if hinted else None,
            "seconds": round(time.monotonic() - started, 1)}


def _kit(mutant: Mutant, zygote: Zygote, tmp: Path, only: str,
         timeout: float) -> tuple[int, list[str]]:
    """The kit on the mutated copy in ``tmp``: every check, or those ``only`` names."""
    # the engine's own run (engine_runs_as_the_spec_asks) has its suite of consistent
    # mistakes (tests/test_kit_watches_the_engine.py); in the whole kit it would add a TRL
    # training run to every TRL mutant the description checks already kill, so it runs only
    # alone: as a mutant's hint, or for a launcher's mutant the rest of the kit let through
    chosen = f"'{only}'" if only == ENGINE_RUN else \
        f"'{only} and not engine_runs'" if only else "'not engine_runs'"
    # one failing check kills the mutant, so the kit stops at the first (pytest's -x: the
    # kit's in-process pytest reads PYTEST_ADDOPTS); a survivor still runs every check
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTEST_ADDOPTS": " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), "-x",
                                                 "-k", chosen, *_other_plugins_off()]))}
    report_path = tmp / "report.json"
    report_path.unlink(missing_ok=True)
    code = zygote.run(["conformance", mutant.engine, "--engine-version", mutant.version,
                       "--json", str(report_path)], cwd=tmp, env=env, timeout=timeout)
    reasons: list[str] = []
    if report_path.is_file():
        report = json.loads(report_path.read_text())
        # failed checks first: -x stops at the first, while an unverified one (a skip) does
        # not stop the kit, so the first failed check is the one that killed
        reasons = [f"{c['check']}: {c['reason']}"[:300]
                   for state in ("failed", "unverified") for c in report["checks"]
                   if c["state"] == state]
    elif code:
        stderr = (tmp / "kit.stderr").read_text(errors="replace").strip()
        reasons = [(stderr.splitlines() or ["(no output)"])[-1][:300]]
    return code, reasons


class Zygote:
    """A ``zygote.py`` process: the kit's third-party imports done once, each kit run a fork
    of it that imports the mutated copy (its files' output in ``kit.stdout`` and
    ``kit.stderr`` beside the copy)."""

    def __init__(self, trl: bool) -> None:
        flags = ["--trl"] if trl else []  # TRL's import: 5 s a zygote, for TRL mutants only
        self.proc = subprocess.Popen([sys.executable, str(HERE / "zygote.py"), *flags],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=tempfile.gettempdir())
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"the zygote did not start (exit {self.proc.wait()})")

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"argv": argv, "cwd": str(cwd), "env": env, "path": [str(cwd)],
                   "stdout": str(cwd / "kit.stdout"), "stderr": str(cwd / "kit.stderr"),
                   "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the zygote stopped (exit {self.proc.wait()})")
        return int(json.loads(answer)["exit"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _run_or_stale(mutant: Mutant, zygote: Zygote,
                  first: str | None = None) -> dict[str, object]:
    try:
        return run_one(mutant, zygote, first=first)
    except (StaleMutant, KitDidNotFinish) as exc:
        return {"name": mutant.name, "engine": mutant.engine, "kind": mutant.kind,
                "killed": None, "exit": None, "reasons": [str(exc)], "seconds": 0}


def baselines(mutants: list[Mutant]) -> list[Mutant]:
    """Each engine and version the mutants are run at, unmutated: the kit must pass them, or
    a kill says nothing about the mutant. Each check a mutant there runs first
    (``first_kills.json``) runs alone too (its name in ``notes``): a kill by that check alone is
    sound only if the check alone passes unmutated."""
    pairs = sorted({(m.engine, m.version) for m in mutants})
    hints = first_kills()
    alone = sorted({(m.engine, m.version, hints[m.name]) for m in mutants if m.name in hints}
                   | {(m.engine, m.version, ENGINE_RUN) for m in mutants
                      if m.kind == "launcher"})
    return [*(Mutant(f"unmutated {engine} {version}", engine, version, (), "baseline")
              for engine, version in pairs),
            *(Mutant(f"unmutated {engine} {version}, {check} alone", engine, version, (),
                     "baseline", notes=check) for engine, version, check in alone)]


def run_all(mutants: list[Mutant], jobs: int = 2,
            hints: bool = True) -> list[dict[str, object]]:
    hinted = first_kills() if hints else {}

    def first(mutant: Mutant) -> str | None:
        return (mutant.notes or None) if mutant.kind == "baseline" else hinted.get(mutant.name)

    zygotes: queue.Queue[Zygote] = queue.Queue()
    started: list[Zygote] = []

    def one(mutant: Mutant) -> dict[str, object]:
        zygote = zygotes.get()
        try:
            return _run_or_stale(mutant, zygote, first(mutant))
        finally:
            zygotes.put(zygote)

    try:
        for _ in range(jobs):
            started.append(Zygote(trl=any(m.engine == "trl" for m in mutants)))
            zygotes.put(started[-1])
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, mutants))
    finally:
        for zygote in started:
            zygote.close()


def table(results: list[dict[str, object]]) -> str:
    total, killed = Counter(), Counter()
    stale = [r for r in results if r["killed"] is None]
    results = [r for r in results if r["killed"] is not None]
    for r in results:
        total[r["engine"]] += 1
        killed[r["engine"]] += bool(r["killed"])
    lines = ["| engine | mutants | killed | kill rate |", "|---|---|---|---|"]
    for engine in sorted(total):
        lines.append(f"| {engine} | {total[engine]} | {killed[engine]} | "
                     f"{100 * killed[engine] / total[engine]:.0f}% |")
    lines.append(f"| all | {sum(total.values())} | {sum(killed.values())} | "
                 f"{100 * sum(killed.values()) / max(1, sum(total.values())):.0f}% |")
    if stale:
        lines.append(f"\n{len(stale)} mutant(s) not counted: their text is not in this tree, "
                     "or the kit ran past its timeout or was killed")
    survivors = [r for r in results if not r["killed"]]
    if survivors:
        lines.append("")
        lines += [f"survived: {r['name']} ({r['kind']})" for r in survivors]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="")
    parser.add_argument("--json", type=Path)
    hints = parser.add_mutually_exclusive_group()
    hints.add_argument("--no-hints", action="store_true",
                       help="run every mutant on the whole kit")
    hints.add_argument("--write-first-kills", action="store_true",
                       help="run every mutant on the whole kit and record the check that "
                            "killed it in first_kills.json")
    args = parser.parse_args()
    chosen = [mu for mu in MUTANTS if args.only in mu.name]
    results = run_all(chosen, args.jobs, hints=not (args.no_hints or args.write_first_kills))
    if args.write_first_kills:
        kills = {**first_kills(), **{str(r["name"]): str(r["reasons"][0]).split(":", 1)[0]
                                     for r in results if r["killed"] and r["reasons"]}}
        FIRST_KILLS.write_text(json.dumps(dict(sorted(kills.items())), indent=1) + "\n")
    print(table(results))
    for r in results:
        if r["killed"]:
            print(f"killed: {r['name']}: {(r['reasons'] or ['exit ' + str(r['exit'])])[0]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
