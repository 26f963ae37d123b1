"""A release's declared blind spots (translate.reading): keys a switch leaves unread, values
read alike. Malformed declarations are the contract's bug; Hydra's edit prefixes name the
same key."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stateset_backend.common.errors import AdapterBug
from stateset_backend.translate.reading import inert_under, read_alike


def _dialect(**keys):
    return SimpleNamespace(name="d", keys=keys)


INERT = [{"keys": ["a.estimator", "a.use_loss"], "where": {"a.coef": 0}, "why": "no reference"}]


def test_keys_are_inert_only_where_the_switch_holds_its_value():
    dialect = _dialect(inert=INERT)
    assert set(inert_under(dialect, {"a.coef": 0, "a.estimator": "k2"})) == {
        "a.estimator", "a.use_loss"}
    assert "no reference" in inert_under(dialect, {"++a.coef": 0.0})["a.use_loss"]
    assert inert_under(dialect, {"a.coef": 0.001}) == {}
    assert inert_under(dialect, {}) == {}  # a switch nobody states is not assumed


def test_values_at_most_the_bound_read_alike():
    dialect = _dialect(alike={"val_period": {"at_most": 0, "why": "only > 0 validates"}})
    assert "only > 0 validates" in read_alike(dialect, "+val_period", -1, 0)
    assert read_alike(dialect, "val_period", -1, 5) is None
    assert read_alike(dialect, "val_period", 0, 0) is None  # the same value needs no reason
    assert read_alike(dialect, "val_period", False, 0) is None  # a switch is not a number
    assert read_alike(dialect, "other", -1, 0) is None


@pytest.mark.parametrize("keys", [
    {"inert": {"a": 1}},
    {"inert": [{"keys": [], "where": {"a": 0}, "why": "x"}]},
    {"inert": [{"keys": ["b"], "where": {}, "why": "x"}]},
    {"inert": [{"keys": ["b"], "where": {"a": 0}, "why": " "}]},
    {"alike": {"k": {"at_most": True, "why": "x"}}},
    {"alike": {"k": {"at_most": 0}}},
    {"alike": ["k"]},
])
def test_a_malformed_declaration_is_the_contracts_bug(keys):
    dialect = _dialect(**keys)
    with pytest.raises(AdapterBug):
        inert_under(dialect, {"a": 0})
        read_alike(dialect, "k", -1, 0)
