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


# Every count the spec bounds by MAX_COUNT, except those the data, other counts or an
# engine cap (prompts per update, mini-batches, epochs, validation samples).
_UNCAPPED_COUNTS = {"group_size", "max_rounds", "rank", "max_prompt_tokens",
                    "max_response_tokens", "max_turns", "max_turn_tokens", "max_total_tokens",
                    "top_k", "total_updates", "every", "keep", "nodes",
                    "processes_per_node", "warmup_updates", "warmup_steps", "gpus_per_node"}
RELEASES = {"native": ["0.1.0"],
            "verl": ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                     "0.9.1"],
            "openrlhf": ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"],
            "nemo-rl": ["0.5.0rc0", "0.6.0", "0.7.0"]}


def _at_the_maximum(doc):
    from stateset_backend.core.spec import MAX_COUNT

    if not isinstance(doc, dict):
        return doc
    out = {}
    for key, value in doc.items():
        if key in _UNCAPPED_COUNTS and type(value) is int:
            out[key] = MAX_COUNT
        elif key == "buffer_tokens":  # must stay below the response limit
            out[key] = MAX_COUNT // 2
        elif key == "seed":
            out[key] = 2**32 - 1
        else:
            out[key] = _at_the_maximum(value)
    return out


def test_counts_at_the_spec_maximum_plan_or_are_refused(capsys):
    """The engines' derived sums and products of the largest counts a spec allows stay
    plannable (canonical JSON carries them exactly) on every release: exit 0 or 3, and every
    engine plans some of them."""
    examples = [p for p in [*EXAMPLES.glob("*.json"), *EXAMPLES.glob("recipes/*.json"),
                            *EXAMPLES.glob("external/*.json")]
                if not p.name.endswith(".local.json")]
    codes: dict[tuple[str, str, str], int] = {}
    for source in examples:
        path = source.with_name(f".max-counts-{source.stem}.local.json")  # beside its data
        path.write_text(json.dumps(_at_the_maximum(json.loads(source.read_text()))))
        try:
            for engine, versions in RELEASES.items():
                for version in versions:
                    codes[source.name, engine, version] = _exit(
                        capsys, "plan", "--engine", engine, "--engine-version", version,
                        str(path), "-o", str(path.with_suffix(".plan")))
        finally:
            path.unlink()
            path.with_suffix(".plan").unlink(missing_ok=True)
    assert set(codes.values()) <= {0, 3}, {k: v for k, v in codes.items() if v not in (0, 3)}
    assert {engine for (_, engine, _), code in codes.items() if code == 0} == set(RELEASES)


def test_counts_beyond_the_maximum_are_invalid_input(capsys, minimal, write_json):
    from stateset_backend.core.spec import MAX_COUNT

    minimal["data"]["max_prompt_tokens"] = MAX_COUNT + 1
    minimal["seed"] = 2**32
    code = main(["validate", str(write_json(minimal))])
    err = capsys.readouterr().err
    assert code == 2 and "data.max_prompt_tokens: Input should be less than or equal to " \
        f"{MAX_COUNT}" in err and "seed: Input should be less than or equal to" in err, err
