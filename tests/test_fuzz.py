"""Fuzzed specs through the CLI's own main(): whatever comes in ends in a documented exit
code (0, 2 or 3), never exit 1 ("internal error", a bug of ours) and never an exception."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spec_fuzz import mutate

from stateset_backend.cli import main
from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, MINIMAL

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BASES = [MINIMAL, FULL_DAPO, FULL_PPO,
         json.loads((EXAMPLES / "support-routing.json").read_text()),
         json.loads((EXAMPLES / "external" / "grpo.json").read_text())]
DOCUMENTED = {0, 2, 3}


def _exit(capsys, *args: str) -> int:
    code = main(list(args))
    capsys.readouterr()
    return code


def _check(path: Path, capsys) -> None:
    code = _exit(capsys, "validate", "--json", str(path))
    assert code in (0, 2), code
    if code:
        return
    assert _exit(capsys, "digest", str(path)) == 0
    assert _exit(capsys, "explain", "--all-engines", "--effective", "--json",
                 str(path)) in DOCUMENTED
    for engine, version in (("native", "0.1.0"), ("verl", "0.9.1"), ("openrlhf", "0.11.2"),
                            ("nemo-rl", "0.7.0")):
        code = _exit(capsys, "plan", "--engine", engine, "--engine-version", version,
                     str(path))
        assert code in DOCUMENTED, (engine, code)


@pytest.mark.parametrize("seed", range(60))
def test_mutated_specs_end_in_a_documented_exit_code(tmp_path, capsys, seed):
    rng = random.Random(seed)
    doc = mutate(rng.choice(BASES), rng, steps=rng.randint(1, 4))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc, ensure_ascii=True))
    _check(path, capsys)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_spec_that_validates_always_digests_and_plans(tmp_path, capsys, data):
    rng = data.draw(st.randoms(use_true_random=False))
    doc = mutate(data.draw(st.sampled_from(BASES)), rng, steps=data.draw(st.integers(1, 3)))
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc, ensure_ascii=True))
    _check(path, capsys)
