"""An error that tells the user which option to change names an option the command line has:
every provider setting is driven through the CLI with a value it refuses, and every ``--flag``
in the one-line error is looked up in the parser the CLI really builds."""

from __future__ import annotations

import argparse
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from stateset_backend.cli import build_parser
from stateset_backend.providers.kuberay.settings import KubeRaySettings
from stateset_backend.providers.slurm.flags import OPTIONS
from stateset_backend.providers.slurm.planning import settings_of
from stateset_backend.providers.slurm.settings import SlurmSettings
from stateset_backend.spec.modeltree import model_in

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "support-routing.json"
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found |= _options(child)
    return found


OPTIONS_DEFINED = _options(build_parser())


def _error(capsys, *args: Any) -> str:
    from stateset_backend.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


def _named_options_exist(line: str) -> None:
    named = set(FLAG.findall(line))
    assert named <= OPTIONS_DEFINED, (sorted(named - OPTIONS_DEFINED), line)


def test_the_parser_has_what_the_test_looks_for():
    assert {"--slurm-time", "--slurm-checkpoint-warning", "--kuberay-settings",
            "--json"} <= OPTIONS_DEFINED


# -- Slurm ----------------------------------------------------------------------------------------
# a value each setting refuses, as typed after its option
SLURM_BAD = {
    "shared_root": "relative/path", "partition": "a;b", "account": "a b", "qos": "q$x",
    "time_limit": "soon", "cpus_per_task": "0", "container_image": "!image",
    "checkpoint_warning_s": "90000", "requeue": "101",
}


def test_every_slurm_option_sets_a_setting_and_has_a_refused_value():
    assert set(OPTIONS) <= set(SlurmSettings.model_fields)
    assert set(SLURM_BAD) == set(OPTIONS)
    assert set(OPTIONS.values()) <= OPTIONS_DEFINED


@pytest.mark.parametrize("setting", sorted(SLURM_BAD))
def test_a_refused_slurm_setting_names_the_option_that_sets_it(capsys, tmp_path, setting):
    given = {"shared_root": "/", setting: SLURM_BAD[setting]}
    argv = [a for name, value in given.items() for a in (OPTIONS[name], value)]
    line = _error(capsys, "plan", "--engine", "native", "--provider", "slurm", *argv, SPEC,
                  "-o", tmp_path / "plan.json")
    assert f"slurm {setting} ({OPTIONS[setting]}): " in line, line
    _named_options_exist(line)


@pytest.mark.parametrize("setting", sorted(set(SlurmSettings.model_fields) - set(OPTIONS)))
def test_a_setting_without_an_option_names_none(setting):
    from stateset_backend.common.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        settings_of({"shared_root": "/", setting: 1})
    assert refused.value.message.startswith(f"slurm {setting}: ")
    assert not FLAG.search(refused.value.message), refused.value.message


def test_slurm_options_without_the_slurm_provider_name_the_options_given(capsys):
    line = _error(capsys, "plan", "--engine", "native", "--slurm-time", "04:00:00", SPEC)
    assert "--slurm-time" in line and "--provider slurm" in line, line
    _named_options_exist(line)


# -- KubeRay --------------------------------------------------------------------------------------
KUBERAY_OK: dict[str, Any] = {
    "image": "rayproject/ray:2.52.0", "ray_version": "2.52.0",
    "volume": {"claim_name": "pvc", "mount_path": "/mnt/s"},
    "head": {"cpu": "4", "memory": "16Gi"}, "worker": {"cpu": "8", "memory": "64Gi"},
    "secrets": {"HF_TOKEN": {"name": "hf", "key": "token"}},
    "auth": {"mode": "token", "secret_name": "ray-token"},
}
# a refused value for every setting, nested ones by their dotted path
KUBERAY_BAD = {
    "image": "Ray:latest", "namespace": "Team_A", "ray_version": "2.49", "python": "python; id",
    "engine_home": "/opt/../etc", "head": "big", "head.cpu": "8 cores", "head.memory": "-1Gi",
    "worker": [], "worker.cpu": "x", "worker.memory": "1 Gi", "worker.gpus": -1,
    "worker.replicas": 0, "service_account": "sa$(id)", "submission_mode": "InteractiveMode",
    "ttl_seconds_after_finished": 2**31, "active_deadline_seconds": 0, "volume": "pvc",
    "volume.claim_name": "Bad Name", "volume.mount_path": "relative",
    "volume.local_path": "/mnt/a b", "volume.runs_subdir": "../up", "secrets": ["HF_TOKEN"],
    "secrets.HF_TOKEN.name": "Bad Name", "secrets.HF_TOKEN.key": "a/b",
    "auth": "token", "auth.mode": "password", "auth.secret_name": "Ray Token",
}


def _fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    found = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        found.add(path)
        inner = model_in(field.annotation)
        if name == "secrets":  # a mapping of variable names to Secret references
            found |= _fields(model_in(field.annotation.__args__[1]), f"{path}.HF_TOKEN.")
        elif inner is not None:
            found |= _fields(inner, f"{path}.")
    return found


def test_every_kuberay_setting_has_a_refused_value():
    assert _fields(KubeRaySettings) == set(KUBERAY_BAD)


@pytest.mark.parametrize("where", sorted(KUBERAY_BAD))
def test_a_refused_kuberay_setting_names_only_options_that_exist(capsys, tmp_path, where):
    doc = copy.deepcopy(KUBERAY_OK)
    *parents, last = where.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = KUBERAY_BAD[where]
    settings = tmp_path / "kuberay.json"
    settings.write_text(json.dumps(doc))
    line = _error(capsys, "plan", "--engine", "native", "--provider", "kuberay",
                  "--kuberay-settings", settings, SPEC)
    assert f"kuberay settings: {where}" in line, line
    _named_options_exist(line)
