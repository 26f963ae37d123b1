"""A plan depends on nothing of the process that made it: the same samples planned in two fresh
interpreters, one under ``PYTHONHASHSEED=1`` and one under ``2``, give byte-identical plans (up
to run id and time); set or dict order, ids and the process never leak into a launch.

Starting an interpreter that can plan costs far more than a plan, so the two interpreters plan
the samples of every version a test class checks, one after another, and each version's check
reads its own pair of plans. An interpreter that dies on the way is started again for each
version alone, so what one version does never decides another's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

from stateset_backend.conformance import memo
from stateset_backend.conformance.checks.planning import CheckFailed
from stateset_backend.conformance.samples import Sample, SampleFiles
from stateset_backend.engines.adapter import EngineAdapter

# Plans each [version, document] of the job, printing one JSON list: the plan as text after
# whatever the adapter printed (on import, then while planning), or the last line the
# interpreter would have printed for the error that stopped it.
_CHILD = """
import importlib, io, json, sys, traceback
from pathlib import Path
out = sys.stdout
sys.stdout = said = io.StringIO()
from stateset_backend.conformance import checks
from stateset_backend.conformance.samples import SampleFiles
job = json.loads(sys.stdin.read())
module, _, qualname = job["adapter"].partition(":")
cls = importlib.import_module(module)
for part in qualname.split("."):
    cls = getattr(cls, part)
files = SampleFiles(Path(job["root"]), job["data_format"], job["sha256"])
imported = said.getvalue()
planned = []
for version, doc in job["plans"]:
    said.seek(0)
    said.truncate()
    try:
        plan = checks.plan_doc(cls(), version, doc, files)
        planned.append({"plan": imported + said.getvalue() + checks.normalized(plan)})
    except Exception as exc:
        lines = "".join(traceback.format_exception(exc)).strip().splitlines()
        planned.append({"error": (lines or ["(no output)"])[-1]})
out.write(json.dumps(planned))
"""

Outcome = tuple[str, str]  # ("agree" | "unverified" | "failed", the reason)


def check_plans_agree_across_processes(adapter: EngineAdapter, version: str, sample: Sample,
                                       files: SampleFiles,
                                       others: Mapping[str, Sample] | None = None) -> str | None:
    """``sample`` planned in two fresh interpreters with different ``PYTHONHASHSEED`` gives
    byte-identical plans (up to run id and time). ``others``: the samples of the other
    versions the caller checks, planned by the same two interpreters (in this order) and
    remembered for their own checks. None when the plans agree; a reason when the adapter
    cannot be imported by name in a fresh interpreter (then nothing was checked)."""
    cls = type(adapter)
    if "<locals>" in cls.__qualname__:
        return f"{cls.__qualname__} is defined inside a function: a fresh interpreter " \
               "cannot import it"
    jobs = dict(others or {})
    jobs[version] = sample
    key = ("agree", memo.adapter_key(adapter),
           tuple((v, s.capability, repr(s.doc)) for v, s in jobs.items()))
    state, reason = memo.once(files, key, lambda: _outcomes(cls, jobs, files))[version]
    if state == "failed":
        raise CheckFailed(reason)
    return reason or None


def _outcomes(cls: type, jobs: dict[str, Sample], files: SampleFiles) -> dict[str, Outcome]:
    job = json.dumps({"adapter": f"{cls.__module__}:{cls.__qualname__}",
                      "plans": [[v, s.doc] for v, s in jobs.items()], "root": str(files.root),
                      "data_format": files.data_format, "sha256": files.sha256})
    runs: list[list[dict[str, str]]] = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.run([sys.executable, "-c", _CHILD], input=job, capture_output=True,
                              text=True, env=env, timeout=300)
        if proc.returncode != 0:
            if len(jobs) > 1:  # each version alone, as if the others had not been asked
                return {v: _outcomes(cls, {v: s}, files)[v] for v, s in jobs.items()}
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            ((version, sample),) = jobs.items()
            return {version: _refused(cls, sample, last)}
        runs.append(json.loads(proc.stdout))
    out: dict[str, Outcome] = {}
    for (version, sample), first, second in zip(jobs.items(), *runs, strict=True):
        error = first.get("error", second.get("error"))  # seed 1's first: it ran first
        out[version] = _refused(cls, sample, error) if error is not None else \
            _compared(sample, first["plan"], second["plan"])
    return out


def _refused(cls: type, sample: Sample, last: str) -> Outcome:
    """A fresh interpreter stopped with ``last`` as the last line it printed."""
    if "ModuleNotFoundError" in last or "AttributeError" in last:
        return "unverified", f"{cls.__module__}:{cls.__qualname__} cannot be imported in a " \
                             f"fresh interpreter ({last})"
    return "failed", f"{sample.capability}: planning in a fresh interpreter failed: {last}"


def _compared(sample: Sample, a: str, b: str) -> Outcome:
    if a == b:
        return "agree", ""
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
              min(len(a), len(b)))
    return "failed", (f"{sample.capability}: plans made under PYTHONHASHSEED 1 and 2 differ: "
                      f"...{a[max(0, at - 80):at + 80]}... vs ...{b[max(0, at - 80):at + 80]}"
                      "...; sort what you iterate")
