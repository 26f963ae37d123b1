"""`explain --upgrade FROM..TO`: what moving one spec between two releases changes, each change
checked against the releases' own configs (their generated surfaces) and parsers (the kit's
launch readers), not against the rules that produced it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance import readers
from stateset_backend.contracts.surfaces import surface
from stateset_backend.engines.registry import build_registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

ROOT = Path(__file__).parent.parent
GRPO = ROOT / "examples" / "external" / "grpo.json"
RECIPES = ROOT / "examples" / "recipes"


def _upgrade(cli_in_process, engine, pair, spec):
    proc = cli_in_process("explain", "--engine", engine, "--upgrade", pair, "--json", spec)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _read(engine, spec_path, version):
    """The launch of each release, read back as that release reads it."""
    plan = make_plan(load_spec(spec_path), build_registry().get(engine), version,
                     base_dir=spec_path.parent)
    return {k.lstrip("+"): v for k, v in readers.BUILTIN[engine](plan).items()}


def test_verl_0_4_1_to_0_9_1(cli_in_process):
    doc = _upgrade(cli_in_process, "verl", "0.4.1..0.9.1", GRPO)
    fields = {s["field"]: s for s in doc["settings"]}
    reward = fields["reward.entrypoint"]
    assert "key" in reward["changes"]
    assert set(reward["before"]["native"]) == {"custom_reward_function.path",
                                               "custom_reward_function.name"}
    assert set(reward["after"]["native"]) == {"reward.custom_reward_function.path",
                                              "reward.custom_reward_function.name"}
    # the releases' own configs: 0.4.1 has no reward.custom_reward_function, 0.9.1 has both
    old, new = surface("verl", "0.4.1")["options"], surface("verl", "0.9.1")["options"]
    assert "reward.custom_reward_function.path" not in old
    assert "reward.custom_reward_function.path" in new and "custom_reward_function.path" in new
    dropped = {d["key"]: d for d in doc["no_longer_read"]}
    assert dropped["custom_reward_function.path"]["newer_reads_it"] is True  # silently kept
    for key, d in dropped.items():
        assert (key in new or any(k.startswith(key + ".") for k in new)) == \
            d["newer_reads_it"], key
    # each release's launch, read as that release reads it, sets exactly what is reported
    read_old, read_new = _read("verl", GRPO, "0.4.1"), _read("verl", GRPO, "0.9.1")
    for key in dropped:
        assert key in flatten(read_old) and key not in flatten(read_new), key
    for s in doc["settings"]:
        for key in (s["after"] or {}).get("native", {}):
            assert key in read_new or any(k.startswith(key + ".") for k in read_new), key
    assert [d["deviation"] for d in doc["deviations"]] == ["micro_batch_token_mean"]
    assert doc["deviations"][0]["what"] == "goes"
    assert doc["digest_meaning_holds"] is False


def test_openrlhf_0_10_1_to_0_11_2(cli_in_process):
    """0.10.2 renamed every flag: the old launch's flags are unknown to 0.11.2's parser."""
    spec = RECIPES / "openrlhf-reinforce-baseline.json"
    doc = _upgrade(cli_in_process, "openrlhf", "0.10.1..0.11.2", spec)
    dropped = [d for d in doc["no_longer_read"] if not d["newer_reads_it"]]
    assert len(dropped) >= 40
    parser = readers.argparse_from_surface(surface("openrlhf", "0.11.2")["options"])
    for d in dropped:
        value = d["value"]
        words = [d["key"]] if value is True else \
            [d["key"], *map(str, value if isinstance(value, list) else [value])]
        with pytest.raises(Exception):  # noqa: B017 - argparse's refusal, any shape
            parser.parse_args(words)
    read_new = _read("openrlhf", spec, "0.11.2")
    for s in doc["settings"]:
        for key, value in (s["after"] or {}).get("native", {}).items():
            # a switch that is off, or None, is a flag the launch leaves out
            assert key in read_new or value is None or value is False, key
    with pytest.raises(readers.LaunchUnreadable):  # the old launch, read by the new parser
        old = make_plan(load_spec(spec), build_registry().get("openrlhf"), "0.10.1",
                        base_dir=spec.parent)
        readers.openrlhf(SimpleNamespace(argv=old.argv, engine_version="0.11.2"))
    assert {d["deviation"]: d["what"] for d in doc["deviations"]} == \
        {"token_mean_per_micro_batch": "goes"}


def test_nemo_rl_0_5_to_0_7(cli_in_process):
    spec = RECIPES / "nemo-rl-grpo_math_1B.json"
    doc = _upgrade(cli_in_process, "nemo-rl", "0.5..0.7", spec)
    assert (doc["from"], doc["to"]) == ("0.5.0", "0.7.0")
    assert {d["deviation"]: d["what"] for d in doc["deviations"]} == \
        {"kl_score_function_gradient": "appears"}
    assert doc["digest_meaning_holds"] is False
    dropped = {d["key"]: d for d in doc["no_longer_read"]}
    assert "data.dataset_name" in dropped
    new = surface("nemo-rl", "0.7.0")["options"]
    read_old = _read("nemo-rl", spec, "0.5.0")
    for key, d in dropped.items():
        assert not d["newer_reads_it"] and key not in new, key
        assert key in read_old, key


def test_a_patch_release_that_changes_nothing_keeps_the_digest(cli_in_process):
    doc = _upgrade(cli_in_process, "verl", "0.9.0..0.9.1", GRPO)
    assert doc["digest_meaning_holds"] is True and doc["deviations"] == []
    text = cli_in_process("explain", "--engine", "verl", "--upgrade", "0.9.0..0.9.1", GRPO)
    assert text.returncode == 0 and "experiment digest: holds" in text.stdout


def test_the_screen_lists_each_kind_of_change(cli_in_process):
    proc = cli_in_process("explain", "--engine", "verl", "--upgrade", "0.4.1..0.9.1", GRPO)
    assert proc.returncode == 0, proc.stderr
    for title in ("settings that change", "declared deviations", "defaults that change",
                  "launch does not", "experiment digest: changes meaning"):
        assert title in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--engine", "verl", "--upgrade", "0.3.0..0.9.1"], "known: 0.4.1"),
    (["--engine", "nemo-rl", "--upgrade", "0.5..0.9"], "nemo-rl 0.9 is not a release"),
    (["--engine", "verl", "--upgrade", "0.9.1"], "FROM..TO"),
    (["--engine", "verl", "--upgrade", "0.9.1..0.9.1"], "one release twice"),
    (["--all-engines", "--upgrade", "0.4.1..0.9.1"], "--engine E alone"),
])
def test_bad_ranges_are_one_line_and_exit_2(cli_in_process, args, words):
    proc = cli_in_process("explain", *args, GRPO)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr
