"""Hydra/OmegaConf overrides carry user strings as data: parsed by hydra-core's own override
parser, applied to a config and resolved with a probe secret in the environment, every string
reads back as the same literal and no interpolation or resolver runs."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stateset_backend.common.errors import InvalidInput
from stateset_backend.translate import overrides

hydra_parser = pytest.importorskip("hydra.core.override_parser.overrides_parser")
omegaconf = pytest.importorskip("omegaconf")

PROBE = "PROBE-SECRET-VALUE"
HOSTILE = [
    "${oc.env:STATESET_PROBE}", "\\${oc.env:STATESET_PROBE}", "\\\\${oc.env:STATESET_PROBE}",
    "a${oc.env:STATESET_PROBE}b", "${oc.decode:'1'}", "${x}", "it's", "\\", "a\\", "a\\\\'",
    "'", "''", "\"", "a,b", "[1,2]", "{a:1}", "k=v", "--flag", "null", "true", "1e3", "~x",
    "+y", "a b", "ünïcödé", "$", "${", "}", "\\'", "a\\'b", "back\\slash",
    "{run_dir}", "x@pkg", "a:b", ".0", "./data", "1_000", "-.5",
]


def _read_back(value_text: str, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv("STATESET_PROBE", PROBE)
    parser = hydra_parser.OverridesParser.create()
    override = parser.parse_override(f"key={value_text}")
    cfg = omegaconf.OmegaConf.create({"key": None})
    cfg.key = override.value()
    return omegaconf.OmegaConf.to_container(cfg, resolve=True)["key"]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_strings_read_back_verbatim(text, monkeypatch):
    assert _read_back(overrides.value(text), monkeypatch) == text


def test_lists_of_hostile_strings_read_back_verbatim(monkeypatch):
    assert _read_back(overrides.value(HOSTILE), monkeypatch) == HOSTILE


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab$\\{}'\",=[]: ~+@.%-_0é")), max_size=14))
@example(".0")
@example("0.")
@example(".5e3")
def test_any_string_reads_back_verbatim(text):
    with pytest.MonkeyPatch.context() as mp:
        assert _read_back(overrides.value(text), mp) == text


@pytest.mark.parametrize("key", ["a=b", "a b", "${x}", "a@pkg", "x,y", "", "-a", "a/b"])
def test_keys_that_could_rewrite_the_override_are_refused(key):
    with pytest.raises(InvalidInput):
        overrides.render({key: 1})


def test_dict_keys_that_could_rewrite_the_override_are_refused():
    with pytest.raises(InvalidInput):
        overrides.render({"ok": {"a:b": 1}})
