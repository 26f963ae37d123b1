"""Identity: the experiment digest depends on the experiment and on nothing else."""

from __future__ import annotations

import copy
import json
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import loads
from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, FULL_SFT
from stateset_backend.spec.digest import experiment_digest, plan_checksum, sha256_of
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.model import NON_IDENTITY_FIELDS, ExperimentSpec
from stateset_backend.spec.modeltree import all_leaf_paths, leaves, model_in


def digest_of(doc: dict[str, Any]) -> str:
    return experiment_digest(parse_spec(doc))


def test_digest_format(minimal):
    d = digest_of(minimal)
    assert d.startswith("sha256:") and len(d) == 71 and int(d[7:], 16) >= 0


def test_key_order_and_whitespace_do_not_matter(minimal):
    text = json.dumps(minimal)
    reordered = json.dumps(dict(reversed(list(minimal.items()))), indent=7)
    assert digest_of(loads(text)) == digest_of(loads(reordered))


def test_one_and_one_point_zero_hash_alike(minimal):
    a, b = copy.deepcopy(minimal), copy.deepcopy(minimal)
    a["optim"] = {"lr": 1, "grad_clip": 1}
    b["optim"] = {"lr": 1.0, "grad_clip": 1.0}
    a["seed"], b["seed"] = 7, 7.0
    assert digest_of(a) == digest_of(b)


def test_defaults_omitted_or_written_out_hash_alike(full):
    spec = parse_spec(full)
    written_out = spec.model_dump(mode="json")
    assert digest_of(written_out) == experiment_digest(spec)


def test_minimal_and_its_normal_form_hash_alike(minimal):
    normal = parse_spec(minimal).model_dump(mode="json")
    assert normal != minimal
    assert digest_of(normal) == digest_of(minimal)


@pytest.mark.parametrize("field, value", [
    ("name", "renamed"), ("labels", {"owner": "someone"}), ("version", 1),
    ("equivalence", "strict"),
    ("resources", {"nodes": 4, "gpus_per_node": 8}),
    ("engine_options", {"verl": {"trainer.logger": ["console"]}}),
])
def test_non_identity_fields_leave_the_digest_unchanged(minimal, field, value):
    before = digest_of(minimal)
    minimal[field] = value
    assert digest_of(minimal) == before


def test_switching_an_optional_section_off_changes_the_digest(minimal):
    before = digest_of(minimal)
    minimal["algorithm"]["kl"] = None
    assert digest_of(minimal) != before


def test_same_experiment_on_any_engine_has_one_digest(minimal):
    a, b = copy.deepcopy(minimal), copy.deepcopy(minimal)
    a["engine_options"] = {"verl": {"x": 1}}
    b["engine_options"] = {"openrlhf": {"--y": 2}}
    assert digest_of(a) == digest_of(b)


def test_plan_checksum_ignores_only_its_own_field():
    doc = {"run_id": "r", "checksum": "sha256:" + "0" * 64}
    assert plan_checksum(doc) == sha256_of({"run_id": "r"})
    assert plan_checksum({**doc, "run_id": "s"}) != plan_checksum(doc)


# -- every identity leaf matters (property-based) --------------------------------------------
def _annotation_at(path: str) -> Any:
    model: Any = ExperimentSpec
    annotation: Any = None
    for part in path.split("."):
        annotation = model.model_fields[part].annotation
        model = model_in(annotation)
    return annotation


def _literal_values(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    values: list[Any] = []
    for arg in typing.get_args(annotation):
        values += _literal_values(arg)
    return values


def _other_value(draw: st.DrawFn, path: str, value: Any) -> Any:
    choices = [v for v in _literal_values(_annotation_at(path)) if v != value]
    if choices:
        return draw(st.sampled_from(choices))
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + draw(st.integers(1, 5))
    if isinstance(value, float):
        return draw(st.floats(0.0, max(2.0, value * 3), allow_nan=False).filter(
            lambda x: x != value))
    if isinstance(value, tuple):  # optim.betas
        return (value[0], draw(st.sampled_from([b for b in (0.95, 0.98, 0.99) if b != value[1]])))
    if isinstance(value, list):
        return [*value, draw(st.sampled_from(["k_proj", "v_proj", "o_proj"]))]
    if isinstance(value, str) and len(value) == 64 and set(value) <= set("0123456789abcdef"):
        return draw(st.sampled_from([c for c in "0123456789ef" if c * 64 != value])) * 64
    if isinstance(value, str):
        return value + draw(st.text("abcxyz_", min_size=1, max_size=4))
    raise AssertionError(f"no mutation for {path}={value!r}")


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc[part]
    doc[last] = value


def _identity_leaves(doc: dict[str, Any]) -> list[str]:
    return [p for p, v in leaves(parse_spec(doc))
            if p.split(".")[0] not in NON_IDENTITY_FIELDS and v is not None]


def test_the_full_specs_cover_every_identity_leaf():
    paths = all_leaf_paths(ExperimentSpec)
    sections = {p for p in paths if any(q.startswith(p + ".") for q in paths)}
    expected = {p for p in paths
                if p.split(".")[0] not in NON_IDENTITY_FIELDS and p not in sections}
    covered = set(_identity_leaves(FULL_DAPO)) | set(_identity_leaves(FULL_PPO)) | \
        set(_identity_leaves(FULL_SFT))
    assert expected <= covered, sorted(expected - covered)


@pytest.mark.parametrize("base", ["dapo", "ppo", "sft"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_changing_any_identity_leaf_changes_the_digest(base, data):
    full = copy.deepcopy({"dapo": FULL_DAPO, "ppo": FULL_PPO, "sft": FULL_SFT}[base])
    normal = parse_spec(full).model_dump(mode="json")
    path = data.draw(st.sampled_from(_identity_leaves(full)), label="leaf")
    mutated = copy.deepcopy(normal)
    old = dict(leaves(parse_spec(normal)))[path]
    _set(mutated, path, _other_value(data.draw, path, old))
    try:
        changed = digest_of(mutated)
    except InvalidInput:
        assume(False)
        return
    assert changed != digest_of(normal), path
