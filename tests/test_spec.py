"""The spec v1: per-objective defaults, cross-field rules, and errors a user can act on."""

from __future__ import annotations

import pytest

from stateset_backend.common.errors import InvalidInput
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.model import OBJECTIVE_DEFAULTS, OBJECTIVES


def test_full_specs_validate(full):
    spec = parse_spec(full)
    assert spec.algorithm.objective in ("dapo", "ppo")


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_fills_its_published_defaults(minimal, objective):
    minimal["algorithm"] = {"objective": objective}
    spec = parse_spec(minimal)
    defaults = OBJECTIVE_DEFAULTS[objective]
    assert spec.algorithm.group_size == defaults["group_size"]
    assert spec.algorithm.loss_aggregation == defaults["loss_aggregation"]
    assert (spec.algorithm.kl is None) == (defaults["kl"] is None)
    assert spec.algorithm.clip.model_dump(exclude={"dual_clip"}) == defaults["clip"]
    assert spec.algorithm.clip.dual_clip is None  # no recipe here uses dual-clip


def test_recipe_specifics():
    base = {"name": "x", "seed": 0, "model": {"path": "m"},
            "data": {"train": {"uri": "t", "sha256": "a" * 64}},
            "reward": {"entrypoint": "r.py:f", "sha256": "b" * 64},
            "budget": {"total_updates": 1}}
    dapo = parse_spec({**base, "algorithm": {"objective": "dapo"}}).algorithm
    assert (dapo.clip.low, dapo.clip.high) == (0.2, 0.28)
    assert dapo.dynamic_sampling is not None and dapo.overlong is not None
    assert dapo.advantage.zero_variance_groups == "exclude"
    drgrpo = parse_spec({**base, "algorithm": {"objective": "dr_grpo"}}).algorithm
    assert drgrpo.advantage.std_normalize is False
    assert drgrpo.loss_aggregation == "seq_mean_token_sum_norm"
    gspo = parse_spec({**base, "algorithm": {"objective": "gspo"}}).algorithm
    assert gspo.ratio_level == "sequence"
    grpo = parse_spec({**base, "algorithm": {"objective": "grpo"}}).algorithm
    assert grpo.advantage.std == "unbiased"
    assert grpo.kl is not None and grpo.kl.estimator == "k3" and grpo.kl.placement == "loss"


def test_partial_section_merges_with_objective_defaults(minimal):
    minimal["algorithm"]["kl"] = {"coef": 0.05}
    kl = parse_spec(minimal).algorithm.kl
    assert kl is not None and (kl.coef, kl.estimator, kl.placement) == (0.05, "k3", "loss")


def test_explicit_null_turns_a_default_section_off(minimal):
    minimal["algorithm"]["kl"] = None
    assert parse_spec(minimal).algorithm.kl is None


def _problems(doc):
    with pytest.raises(InvalidInput) as info:
        parse_spec(doc)
    return info.value.details["problems"]


@pytest.mark.parametrize("coef", [0, -0.1])
def test_kl_coefficient_must_be_positive(minimal, coef):
    minimal["algorithm"]["kl"] = {"coef": coef}
    assert any(p.startswith("algorithm.kl.coef:") for p in _problems(minimal))


def test_unknown_key_suggests_the_near_miss(minimal):
    minimal["algorithm"]["grup_size"] = 3
    minimal["optim"] = {"learning_rate": 1e-6}
    problems = _problems(minimal)
    assert "algorithm.grup_size: unknown key; did you mean 'group_size'?" in problems
    assert any(p.startswith("optim.learning_rate: unknown key") for p in problems)


def test_every_problem_is_reported_at_once(minimal):
    minimal["seed"] = "seven"
    minimal["budget"]["total_updates"] = 0
    minimal["data"]["train"]["sha256"] = "xyz"
    paths = {p.split(":")[0] for p in _problems(minimal)}
    assert {"seed", "budget.total_updates", "data.train.sha256"} <= paths


@pytest.mark.parametrize("change, message", [
    ({"objective": "gspo", "ratio_level": "token"}, "sequence-level ratio"),
    ({"objective": "grpo", "group_size": 1}, "group_size must be >= 2"),
    ({"objective": "ppo", "gae": None}, "ppo needs gae"),
    ({"objective": "grpo", "gae": {"gamma": 1.0}}, "gae applies to ppo only"),
    ({"objective": "dapo", "advantage": {"zero_variance_groups": "keep"}},
     "dynamic_sampling removes zero-variance groups"),
])
def test_cross_field_rules(minimal, change, message):
    minimal["algorithm"] = change
    assert any(message in p for p in _problems(minimal))


def test_overlong_buffer_must_fit_in_the_response_budget(minimal):
    minimal["algorithm"] = {"objective": "dapo", "overlong": {"buffer_tokens": 600}}
    assert any("buffer_tokens must be smaller" in p for p in _problems(minimal))


def test_python_reward_must_be_pinned(minimal):
    del minimal["reward"]["sha256"]
    assert any("needs sha256" in p for p in _problems(minimal))
    minimal["reward"] = {"entrypoint": "reward.py", "sha256": "b" * 64}
    assert any("'file.py:function'" in p for p in _problems(minimal))


def test_non_finite_numbers_are_rejected_even_from_python(minimal):
    minimal["optim"] = {"lr": float("nan")}
    assert any(p.startswith("optim.lr:") for p in _problems(minimal))
