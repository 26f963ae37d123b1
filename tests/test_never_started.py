"""An attempt whose engine never began (its launcher is not there, the cluster would not take
the job) ends ``failed`` with a result like any other, exit 4, and says so: "never started"
and why, one line, with no exit code the engine never had and none of the checks that only
fail because nothing ran (tests/test_slurm_runs.py and tests/test_ray_provider.py drive the
same through a refused sbatch and an unreachable Ray cluster)."""

from __future__ import annotations

import json

import pytest

from stateset_backend.common.errors import EngineFailed
from stateset_backend.engines.registry import build_registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.providers.base import LocalProvider, PreparedLaunch
from stateset_backend.runs.results import failure_reason
from stateset_backend.runs.runner import raise_for_status, run_plan
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.files import load_spec


@pytest.fixture
def echo_plan(minimal_with_files, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(minimal_with_files))
    registry = build_registry()
    plan = make_plan(load_spec(spec), registry.get("echo"), "1.2.0", base_dir=tmp_path)
    return plan, registry


def test_a_missing_launcher_is_an_attempt_that_never_started(echo_plan, tmp_path,
                                                             cli_in_process):
    plan, registry = echo_plan
    launcher = tmp_path / "no-such-launcher"
    plan = plan.model_copy(update={"argv": [str(launcher), *plan.argv[1:]]})
    store = RunStore(tmp_path / "runs")
    result, path = run_plan(plan, registry, store, echo_stderr=False)
    why = f"never started: cannot start {launcher}: No such file or directory"
    assert result.status == "failed" and result.exit_code is None
    assert failure_reason(result) == why
    with pytest.raises(EngineFailed) as raised:
        raise_for_status(result, path)
    assert raised.value.exit_code == 4
    assert raised.value.message.startswith(f"run {plan.run_id} attempt 1 failed: {why} "
                                           "(result: ")
    assert "engine exited" not in raised.value.message and "identity" not in \
        raised.value.message
    shown = cli_in_process("runs", "show", plan.run_id, "--runs-dir", store.root)
    assert shown.returncode == 0 and "never started: cannot start" in shown.stdout
    assert "engine exited" not in shown.stdout
    compared = cli_in_process("--json", "runs", "compare", plan.run_id, "--runs-dir",
                              store.root)
    attempt, = json.loads(compared.stdout)["attempts"]
    assert attempt["status"] == "failed" and attempt["reason"] == why


def test_the_local_provider_says_a_launcher_never_started(tmp_path):
    prepared = PreparedLaunch([str(tmp_path / "missing")], tmp_path, {}, {}, "sub", False)
    exit_ = LocalProvider().launch(prepared, timeout=10)
    assert not exit_.started and exit_.reason == \
        f"cannot start {tmp_path / 'missing'}: No such file or directory"

