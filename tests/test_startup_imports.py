"""The fast commands never import torch, transformers, ray or any engine, and what answers
from the spec and the contracts loads nothing that only running or storing a run needs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "ray", "verl", "openrlhf", "nemo_rl", "vllm", "peft",
         "safetensors", "matplotlib", "mlflow", "in_toto_attestation", "trl", "pytest")
# what planning never needs: the run store (sqlite3), the conversation workers
# (multiprocessing), KubeRay's settings (their name patterns compile slowly)
NOT_AT_PLAN_TIME = ("sqlite3", "multiprocessing", "stateset_backend.providers.kuberay")

PROBE = """
import json, sys
from stateset_backend.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
names = json.loads(sys.argv[1])
print('LOADED=' + json.dumps(sorted(m for m in sys.modules if any(
    m == n or m.startswith(n + '.') for n in names))))
"""


def _loaded(names: tuple[str, ...], *args: str) -> list[str]:
    """The modules among ``names`` (and their submodules) that a fresh CLI process running
    ``args`` has imported when it ends."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(names), *args],
                          capture_output=True, text=True, timeout=60)
    line = [x for x in proc.stdout.splitlines() if x.startswith("LOADED=")]
    assert line, proc.stderr
    return json.loads(line[-1][len("LOADED="):])


@pytest.mark.parametrize("command", [
    ["--help"], ["validate", "{spec}"], ["digest", "{spec}"], ["engines"],
    ["check", "--engine", "verl", "--engine-version", "0.9.1", "{spec}"],
    ["explain", "--engine", "native", "{spec}"], ["explain", "--all-engines", "{spec}"],
    ["plan", "--engine", "native", "{spec}", "-o", "{plan}"],
    ["runs", "list", "--runs-dir", "{runs}"], ["runs", "compare", "--runs-dir", "{runs}", "x"],
])
def test_command_imports_no_heavy_library(command, write_json, minimal, tmp_path):
    spec = write_json(minimal)
    args = [a.format(spec=spec, plan=tmp_path / "plan.json", runs=tmp_path / "runs")
            for a in command]
    assert _loaded(HEAVY, *args) == []


@pytest.mark.parametrize("command", [
    ["engines"], ["explain", "--all-engines", "--effective", "{spec}"],
    ["plan", "--engine", "native", "{spec}", "-o", "{plan}"],
])
def test_planning_loads_no_run_store_or_worker(command, write_json, minimal, tmp_path):
    spec = write_json(minimal)
    args = [a.format(spec=spec, plan=tmp_path / "plan.json") for a in command]
    assert _loaded(NOT_AT_PLAN_TIME, *args) == []


@pytest.mark.parametrize(("module", "not_loaded"), [
    # the plugin API every adapter imports at registry time
    ("stateset_backend.plugin", NOT_AT_PLAN_TIME),
    # every `run` imports the runner; a KubeRay plan's machinery loads for a KubeRay plan
    ("stateset_backend.runs.runner", ("stateset_backend.providers.kuberay",
                                      "stateset_backend.plan.kuberay")),
    # hashing a file (attest, evaluate, the run store) needs none of the spec's models
    ("stateset_backend.spec.content", ("pydantic", "stateset_backend.spec.model")),
])
def test_module_loads_only_what_its_importers_need(module, not_loaded):
    probe = (f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules "
             f"if any(m == n or m.startswith(n + '.') for n in {not_loaded!r}))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


GC_PROBE = """
import gc, json, sys
before = gc.get_threshold(), gc.get_freeze_count()
from stateset_backend.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "same": (gc.get_threshold(), gc.get_freeze_count()) == before}))
try:
    main()  # as the console script runs it: the process is the CLI's
except SystemExit:
    pass
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count() > 0,
                  "enabled": gc.isenabled()}))
"""


def test_only_the_cli_process_tunes_the_cyclic_collector(write_json, minimal):
    """The console script raises the collector's first threshold and exits without a final
    collection; main() called from Python (a test, an embedding tool) leaves the host's
    collector as it was. The collector stays enabled either way: a command that supervises
    an engine for hours still collects its cycles."""
    path = str(write_json(minimal))
    proc = subprocess.run([sys.executable, "-c", GC_PROBE, "digest", path],
                          capture_output=True, text=True, timeout=60)
    embedded, own = (json.loads(line) for line in proc.stdout.splitlines()
                     if line.startswith("{"))
    assert embedded == {"code": 0, "same": True}, proc.stderr
    assert own["enabled"] and own["frozen"] and own["threshold"][0] > 700, own
