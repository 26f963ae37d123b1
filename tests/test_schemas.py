"""The checked-in JSON Schemas are generated from the models and must not drift from them."""

from __future__ import annotations

import json

import jsonschema
import pytest

from stateset_backend.publish.schemas import NAMES, generate, packaged, render
from stateset_backend.spec.files import parse_spec


@pytest.mark.parametrize("name", NAMES)
def test_checked_in_schema_matches_its_model(name):
    assert packaged(name) == render(generate(name)), (
        f"schemas/{name}.json is stale: run `python -m stateset_backend.publish.schemas`")


@pytest.mark.parametrize("name", NAMES)
def test_schemas_are_valid_json_schema(name):
    jsonschema.Draft202012Validator.check_schema(json.loads(packaged(name)))


def test_normalized_specs_validate_against_the_spec_schema(full):
    schema = json.loads(packaged("spec"))
    jsonschema.Draft202012Validator(schema).validate(parse_spec(full).model_dump(mode="json"))


def test_schema_command_prints_each_schema(cli):
    for name in NAMES:
        proc = cli("schema", name)
        assert proc.returncode == 0
        assert json.loads(proc.stdout)["$id"] == generate(name)["$id"]


def test_unknown_schema_name(cli):
    proc = cli("schema", "nope")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("stateset-backend: error: unknown schema 'nope' "
                                   "(one of: spec, plan, result, contract)")
