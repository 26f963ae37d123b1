"""The fast commands never import torch, transformers, ray or any engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "ray", "verl", "openrlhf", "nemo_rl", "vllm", "peft",
         "safetensors", "matplotlib", "mlflow", "in_toto_attestation", "trl", "pytest")

PROBE = """
import json, sys
from stateset_backend.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r})
print('HEAVY=' + json.dumps(heavy))
"""


@pytest.mark.parametrize("command", [
    ["--help"], ["validate", "{spec}"], ["digest", "{spec}"], ["engines"],
    ["check", "--engine", "verl", "--engine-version", "0.9.1", "{spec}"],
    ["explain", "--engine", "native", "{spec}"],
    ["plan", "--engine", "native", "{spec}", "-o", "{plan}"],
    ["runs", "list", "--runs-dir", "{runs}"], ["runs", "compare", "--runs-dir", "{runs}", "x"],
])
def test_command_imports_no_heavy_library(command, write_json, minimal, tmp_path):
    spec = write_json(minimal)
    args = [a.format(spec=spec, plan=tmp_path / "plan.json", runs=tmp_path / "runs")
            for a in command]
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *args],
                          capture_output=True, text=True, timeout=60)
    line = [x for x in proc.stdout.splitlines() if x.startswith("HEAVY=")][-1]
    assert json.loads(line[len("HEAVY="):]) == [], proc.stderr
