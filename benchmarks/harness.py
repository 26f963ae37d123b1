"""What every side-by-side benchmark here shares: rounds interleaved so that load on the machine
falls on every side alike, the sides' order alternating from round to round, a warm-up round
that is not kept, medians with their range, the machine they ran on, and README sections
regenerated from a stored measurement instead of typed in."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def interleaved(sides: Sequence[str], rounds: int, warmup: int,
                run: Callable[[str, int], Any]) -> dict[str, list[Any]]:
    """``run(side, round)`` for every side in every round, the order reversed each round;
    the first ``warmup`` rounds run but are not kept."""
    kept: dict[str, list[Any]] = {side: [] for side in sides}
    for r in range(warmup + rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            value = run(side, r)
            if r >= warmup:
                kept[side].append(value)
    return kept


def spread(values: Sequence[float], digits: int = 2) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits),
            "min": round(min(values), digits), "max": round(max(values), digits)}


def per_round(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """``spread`` with every kept round's value, for whoever checks the summary."""
    return {**spread(values, digits), "rounds": [round(v, digits) for v in values]}


def show(s: dict[str, float], unit: str = "", digits: int = 2) -> str:
    """``median (min to max)``, as the README writes a measurement."""
    return (f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}\u2013"
            f"{s['max']:.{digits}f})")


def machine(threads: int | None = None) -> dict[str, Any]:
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpus": os.cpu_count(), "cpu": model,
                            "python": platform.python_version(), "torch": torch.__version__}
    if threads is not None:
        info["torch_threads"] = threads
    return info


def pinned_env(threads: int) -> dict[str, str]:
    """A child's environment with its thread pools fixed to ``threads``."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def set_threads(threads: int) -> None:
    """Fix this process's torch thread pools (call before any torch work: the inter-op pool
    can be sized only once, and only before it starts)."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already started: the caller checks the size
        torch.set_num_interop_threads(threads)


def child(argv: list[str], env: dict[str, str], marker: str = "RESULT=") -> str:
    """Run ``argv``; return the payload of its last ``marker`` line, or stop with its stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(marker)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(argv[:6])} exited {proc.returncode}:\n"
                         f"{proc.stderr[-3000:]}")
    return lines[-1][len(marker):]


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Seconds ``argv`` takes, start-up included; stop with its stderr if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} exited {proc.returncode}:\n"
                         f"{proc.stderr[-3000:]}")
    return seconds


def readme_options(parser: argparse.ArgumentParser, measured: Path) -> None:
    """``--write-readme`` and ``--render-only``: every benchmark's README section is generated
    from the measurement it stores in ``measured``, never typed in."""
    parser.add_argument("--write-readme", action="store_true",
                        help=f"store the measurement in {measured.relative_to(ROOT)} and "
                             "regenerate the README's section from it")
    parser.add_argument("--render-only", action="store_true",
                        help="regenerate the README's section from the stored measurement")


def replace_section(begin: str, end: str, text: str, readme: Path = README) -> None:
    """Put ``text`` (which starts with ``begin`` and ends with ``end``) where they are."""
    doc = readme.read_text(encoding="utf-8")
    start, stop = doc.index(begin), doc.index(end) + len(end)
    readme.write_text(doc[:start] + text + doc[stop:], encoding="utf-8")
