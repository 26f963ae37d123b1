"""The Slurm provider: its settings and batch script refuse what Slurm or the shell would
misread, its end states map to the documented outcomes, and against a real single-node Slurm
(tests/slurm_cluster.py) a job is submitted, followed, cancelled, stopped on Slurm's warning
signal and timed out as the docs say."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from slurm_cluster import ON_ONE_WORKER, RAY_AUTH_VARS, slurm  # noqa: F401  (the fixture)

from stateset_backend.common.errors import Unsupported
from stateset_backend.providers.base import EXIT_STOPPED, STOP_REQUEST, PreparedLaunch
from stateset_backend.providers.slurm.job import JobState, SlurmProvider, to_exit
from stateset_backend.providers.slurm.script import SCRIPT_FILE, render
from stateset_backend.providers.slurm.settings import SlurmSettings

pytestmark = ON_ONE_WORKER
RUN_ID = "20261205T000000Z-abcdef01"


@pytest.mark.parametrize("field, value", [
    ("partition", "gpu\n#SBATCH --uid=0"), ("partition", "gpu --exclusive"),
    ("account", "$(id)"), ("time_limit", "1:00:00 --mem=0"), ("time_limit", "forever"),
    ("container_image", "img;rm -rf ~"), ("shared_root", "relative/path"),
    ("shared_root", "/shared/../etc"), ("shared_root", "/shared\n#SBATCH"),
])
def test_a_setting_slurm_or_the_shell_would_misread_is_refused(field, value):
    with pytest.raises(ValidationError):
        SlurmSettings(**{"shared_root": "/shared", field: value})


@pytest.mark.parametrize("launch", ["process", "torchrun", "ray"])
def test_every_script_is_valid_bash_with_one_directive_per_setting(launch, tmp_path):
    settings = SlurmSettings(shared_root="/shared dir/it's", partition="gpu", account="proj",
                             container_image="nvcr.io/nvidia/pytorch:24.01-py3")
    text = render(settings, launch=launch, run_id=RUN_ID, engine="verl", nodes=2,
                  gpus_per_node=8)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=gpu" in directives and "#SBATCH --gpus-per-node=8" in directives
    assert "#SBATCH --signal=B:USR1@120" in directives and "#SBATCH --no-requeue" in directives
    assert "'/shared dir/it'\"'\"'s:/shared dir/it'\"'\"'s'" in text  # quoted, one word


def test_a_run_id_or_engine_name_that_is_not_a_name_never_reaches_the_script():
    with pytest.raises(Unsupported):  # exit 3, never an internal error
        render(SlurmSettings(shared_root="/s"), launch="process", run_id=RUN_ID,
               engine="x\nrm -rf /", nodes=1, gpus_per_node=0)


@pytest.mark.parametrize("state, code, stop_file, expected", [
    (JobState("COMPLETED", 0), 0, False, (0, False, False)),
    (JobState("FAILED", 3, reason="NonZeroExitCode"), 3, False, (3, False, False)),
    (JobState("TIMEOUT", 0, 15), 0, False, (1, False, True)),
    (JobState("PREEMPTED", 0, 15), 0, False, (1, False, False)),
    (JobState("NODE_FAIL", 0), 0, False, (1, False, False)),
    (JobState("OUT_OF_MEMORY", 0, 9), 0, False, (1, False, False)),
    (JobState("FAILED", EXIT_STOPPED), EXIT_STOPPED, True, (EXIT_STOPPED, True, False)),
    (JobState("TIMEOUT", EXIT_STOPPED), EXIT_STOPPED, True, (EXIT_STOPPED, True, False)),
])
def test_each_end_state_maps_to_its_outcome(state, code, stop_file, expected, tmp_path):
    if stop_file:
        (tmp_path / STOP_REQUEST).touch()
    exit_ = to_exit(state, tmp_path, [])
    assert (exit_.code, exit_.interrupted, exit_.timed_out) == expected
    if state.state not in ("COMPLETED",):
        assert exit_.reason  # the result says what Slurm said


def test_a_cancel_by_the_user_or_the_timeout_is_named(tmp_path):
    assert to_exit(None, tmp_path, ["SIGINT"]).interrupted
    timed = to_exit(None, tmp_path, ["timeout"])
    assert timed.timed_out and not timed.interrupted and "timeout" in timed.reason


def _prepared(run_dir: Path, code: str, launch: str = "process",
              set_env: dict[str, str] | None = None, processes: int | None = None,
              nodes: int = 1, **settings: object) -> PreparedLaunch:
    (run_dir / "slurm").mkdir(parents=True)
    (run_dir / SCRIPT_FILE).write_text(render(
        SlurmSettings(shared_root=str(run_dir.anchor), **settings), launch=launch,
        run_id=RUN_ID, engine="probe", nodes=nodes, gpus_per_node=0,
        processes_per_node=processes))
    return PreparedLaunch([sys.executable, "-c", code], run_dir, dict(os.environ),
                          set_env or {}, "probe", False)


@pytest.fixture
def on_slurm(slurm, monkeypatch, tmp_path):  # noqa: F811
    """Jobs get this environment (sbatch exports it): a home of their own and no Ray token
    setting of the user's."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    for name in RAY_AUTH_VARS:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return slurm


@pytest.mark.slow
def test_a_job_runs_with_the_launch_as_data(on_slurm, tmp_path):
    hostile = "it's $(touch pwned) `id` \"q\"\n; echo no"
    prepared = _prepared(tmp_path / "run", "import os, sys; print(os.environ['HOSTILE'], "
                         "sys.argv[1:], sep='|'); print('to stderr', file=sys.stderr)",
                         set_env={"HOSTILE": hostile})
    prepared.argv.append(hostile)
    exit_ = SlurmProvider().launch(prepared, timeout=60)
    assert exit_.code == 0 and not exit_.interrupted
    out = prepared.stdout_path.read_text()
    assert out == f"{hostile}|{[hostile]!r}\n"
    assert "to stderr" in prepared.stderr_path.read_text()
    assert not (prepared.run_dir / "pwned").exists()


@pytest.mark.slow
def test_a_failing_job_keeps_its_exit_code(on_slurm, tmp_path):
    exit_ = SlurmProvider().launch(_prepared(tmp_path / "run", "raise SystemExit(3)"), 60)
    assert (exit_.code, exit_.interrupted) == (3, False) and "FAILED" in exit_.reason


@pytest.mark.slow
def test_the_runs_timeout_cancels_the_job_and_waits_for_its_end(on_slurm, tmp_path):
    prepared = _prepared(tmp_path / "run", "import time; time.sleep(300)")
    t0 = time.monotonic()
    exit_ = SlurmProvider().launch(prepared, timeout=2)
    assert exit_.timed_out and time.monotonic() - t0 < 30
    job = (prepared.run_dir / "slurm" / "job_id").read_text().strip()
    state = on_slurm.run("scontrol", "show", "job", "-o", job).stdout
    assert "JobState=CANCELLED" in state


@pytest.mark.slow
def test_slurms_warning_signal_stops_an_engine_that_honours_it(on_slurm, tmp_path):
    code = ("import pathlib, sys, time\n"
            "for i in range(600):\n"
            f"    if pathlib.Path({STOP_REQUEST!r}).exists(): sys.exit({EXIT_STOPPED})\n"
            "    time.sleep(0.1)\n")
    prepared = _prepared(tmp_path / "run", code)

    def warn() -> None:  # what --signal=B:USR1@N does before the limit, now
        job_file = prepared.run_dir / "slurm" / "job_id"
        while not job_file.exists():
            time.sleep(0.1)
        time.sleep(1.5)
        on_slurm.run("scancel", "--batch", "--signal=USR1", job_file.read_text().strip())

    threading.Thread(target=warn, daemon=True).start()
    exit_ = SlurmProvider().launch(prepared, timeout=120)
    assert (exit_.code, exit_.interrupted) == (EXIT_STOPPED, True)
    assert "warning signal" in exit_.reason


@pytest.mark.slow
@pytest.mark.parametrize("token_file", [False, True], ids=["no-token", "users-token-file"])
def test_a_ray_launch_runs_head_and_driver_on_the_node(on_slurm, tmp_path, token_file):
    """With a token file in the user's home, `ray start` runs the head in token mode: the
    job's other Ray processes must then use the token too, and nothing of the run holds it."""
    pytest.importorskip("ray", reason="Ray is missing: pip install -e '.[ray]'")
    token = "stateset-test-" + os.urandom(16).hex()
    if token_file:
        (tmp_path / "home" / ".ray").mkdir()
        (tmp_path / "home" / ".ray" / "auth_token").write_text(token)
    driver = ("import os, ray\n"
              "print('auth', os.environ.get('RAY_AUTH_MODE', 'unset'))\n"
              "ray.init(_node_ip_address=os.environ['STATESET_HEAD_IP'], log_to_driver=False)\n"
              "@ray.remote(num_cpus=0.25)\n"
              "def square(x):\n    return x * x\n"
              "print(ray.get([square.remote(i) for i in range(8)]))\n"
              "print(sum(n['Alive'] for n in ray.nodes()), os.environ['RAY_ADDRESS'])\n"
              "print('cpus', os.environ['SLURM_CPUS_PER_TASK'], "
              "ray.cluster_resources()['CPU'])\n")
    # Ray rewrites 127.0.0.1 to the host's interface address; 127.0.0.2 keeps it on loopback
    prepared = _prepared(tmp_path / "run", driver, launch="ray",
                         set_env={"STATESET_RAY_IP": "127.0.0.2"})
    exit_ = SlurmProvider().launch(prepared, timeout=240)
    out = prepared.stdout_path.read_text()
    assert exit_.code == 0, prepared.stderr_path.read_text()[-2000:]
    port = _ports(prepared)["ray_port"]
    assert "[0, 1, 4, 9, 16, 25, 36, 49]" in out and f"1 127.0.0.2:{port}" in out
    # the driver and the engine's workers get the CPUs Slurm gave the job, and Ray knows them
    assert "cpus 2 2.0" in out and "NumCPUs=2 " in _job(on_slurm, prepared)
    assert f"auth {'token' if token_file else 'unset'}" in out
    for path in prepared.run_dir.rglob("*"):
        assert not path.is_file() or token.encode() not in path.read_bytes(), path


def _ports(prepared: PreparedLaunch) -> dict[str, int]:
    text = (prepared.run_dir / "slurm" / "ports").read_text()
    return {k: int(v) for k, v in (line.split("=") for line in text.split())}


def _job(cluster, prepared: PreparedLaunch) -> str:
    job = (prepared.run_dir / "slurm" / "job_id").read_text().strip()
    return cluster.run("scontrol", "show", "job", "-o", job).stdout


@pytest.mark.slow
def test_the_job_asks_for_a_cpu_for_every_process_it_starts(on_slurm, tmp_path):
    code = "import os; print('cpus', os.environ.get('SLURM_CPUS_PER_TASK'))"
    prepared = _prepared(tmp_path / "run", code, launch="torchrun", processes=2)
    assert "#SBATCH --cpus-per-task=2" in (prepared.run_dir / SCRIPT_FILE).read_text()
    exit_ = SlurmProvider().launch(prepared, timeout=60)
    assert exit_.code == 0, prepared.stderr_path.read_text()
    assert "NumCPUs=2 " in _job(on_slurm, prepared)
    assert prepared.stdout_path.read_text() == "cpus 2\n"  # the step has them too
    job = int((prepared.run_dir / "slurm" / "job_id").read_text())
    assert _ports(prepared) == {"rendezvous_port": 20000 + job % 3000 * 3}


def test_fewer_cpus_than_processes_is_refused_naming_the_option():
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.providers.slurm.planning import plan_files

    with pytest.raises(InvalidInput, match=r"\(--slurm-cpus-per-task\): 1 is fewer than the 2 "
                                           r"processes native starts on each node"):
        plan_files({"shared_root": "/", "cpus_per_task": 1}, run_id=RUN_ID, engine="native",
                   launch="torchrun", nodes=1, gpus_per_node=0, base_dir=Path("/"),
                   processes_per_node=2)


@pytest.mark.slow
def test_two_ray_jobs_on_one_host_each_get_their_own_ports(on_slurm, tmp_path):
    """Both heads on the same first node at once: with one fixed port the second job's head
    could not start, and its driver would join the first job's cluster."""
    pytest.importorskip("ray", reason="Ray is missing: pip install -e '.[ray]'")
    driver = ("import os, ray\n"
              "ray.init(_node_ip_address=os.environ['STATESET_HEAD_IP'], log_to_driver=False)\n"
              "print(os.environ['RAY_ADDRESS'], ray.get_runtime_context().get_job_id(), "
              "sum(n['Alive'] for n in ray.nodes()))\n")
    jobs = [_prepared(tmp_path / f"run{i}", driver, launch="ray", cpus_per_task=1,
                      set_env={"STATESET_RAY_IP": "127.0.0.2"}) for i in (1, 2)]
    exits: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: exits.__setitem__(
        i, SlurmProvider().launch(jobs[i], timeout=300))) for i in (0, 1)]
    for thread in threads:
        thread.start()
        time.sleep(1)
    for thread in threads:
        thread.join()
    ports = [_ports(p)["ray_port"] for p in jobs]
    assert ports[0] != ports[1]
    for i, prepared in enumerate(jobs):
        assert exits[i].code == 0, prepared.stderr_path.read_text()[-2000:]
        said = [line for line in prepared.stdout_path.read_text().splitlines()
                if line.startswith("127.0.0.2:")]
        assert said == [f"127.0.0.2:{ports[i]} {said[0].split()[1]} 1"]  # its own 1-node head
        assert f"Ray head on 127.0.0.2:{ports[i]}" in prepared.stderr_path.read_text()
    running = [_job(on_slurm, p) for p in jobs]  # both ran on the same node
    assert all("NodeList=" in r for r in running)


@pytest.mark.slow
def test_a_job_past_its_time_limit_ends_as_a_documented_failure(on_slurm, tmp_path):
    """Slurm enforces limits in whole minutes, checked every 30-60 s: this takes 1-2 min."""
    prepared = _prepared(tmp_path / "run", "import time; time.sleep(600)", time_limit="1",
                         checkpoint_warning_s=0)
    exit_ = SlurmProvider().launch(prepared, timeout=300)
    assert exit_.timed_out and not exit_.interrupted
    assert exit_.reason == "Slurm ended the job at its time limit"


def _submitted(cluster) -> int:
    return len([r for r in cluster.run("squeue", "-h", "-o", "%i").stdout.splitlines() if r])


@pytest.mark.parametrize("warning", [["--slurm-checkpoint-warning", "120"], []],
                         ids=["given", "default"])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_warning_not_shorter_than_the_time_limit_is_refused_before_submission(
        on_slurm, tmp_path, capsys, command, warning):
    """The engine would be asked to stop after its first update: exit 2 before anything
    reaches Slurm, naming both options."""
    from stateset_backend.cli import build_parser, main

    spec = Path(__file__).resolve().parents[1] / "examples" / "support-routing.json"
    before = _submitted(on_slurm)
    out = ["-o", str(tmp_path / "plan.json")] if command == "plan" else \
        ["--runs-dir", str(tmp_path / "runs")]
    capsys.readouterr()
    code = main([command, "--engine", "native", str(spec), *out, "--provider", "slurm",
                 "--slurm-shared-root", "/", "--slurm-time", "00:02:00", *warning])
    err = capsys.readouterr().err
    line, = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err
    assert line == ("stateset-backend: error: slurm checkpoint_warning_s "
                    "(--slurm-checkpoint-warning): 120 s must be shorter than the time limit "
                    "00:02:00 (120 s, --slurm-time); lower it or raise the limit")
    defined = {o for a in build_parser()._actions for o in a.option_strings} | {
        o for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)
        for p in a.choices.values() for b in p._actions for o in b.option_strings}
    assert {"--slurm-checkpoint-warning", "--slurm-time"} <= defined
    assert _submitted(on_slurm) == before and not (tmp_path / "runs").exists()
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("asked, why", [
    ({"partition": "short", "time_limit": "00:10:00"},
     "its time limit 00:10:00 (--slurm-time) is above partition short's MaxTime 00:05:00"),
    ({"nodes": 2, "launch": "torchrun"},
     "it asks for 2 nodes and partition debug gives a job at most 1"),
])
def test_a_job_its_partition_can_never_start_is_not_submitted(on_slurm, tmp_path, asked, why):
    """Slurm would accept both and leave them pending for ever (no EnforcePartLimits)."""
    before = _submitted(on_slurm)
    prepared = _prepared(tmp_path / "run", "print('never')", **asked)
    exit_ = SlurmProvider().launch(prepared, timeout=30)
    assert exit_.code == 1 and not exit_.timed_out and not exit_.started
    assert exit_.reason.startswith("Slurm would never start this job (nothing was submitted): ")
    assert why in exit_.reason
    assert not (prepared.run_dir / "slurm" / "job_id").exists()
    assert _submitted(on_slurm) == before


@pytest.mark.slow
def test_a_waiting_job_says_why_and_a_timeout_records_it(on_slurm, tmp_path, capsys,
                                                          monkeypatch):
    from stateset_backend.providers.slurm import queue

    monkeypatch.setattr(queue, "REPORT_EVERY_S", 1.0)
    cpus = os.cpu_count() or 1
    blocker = on_slurm.run("sbatch", "--parsable", f"--cpus-per-task={cpus}", "-o", "/dev/null",
                           "--wrap", "sleep 120").stdout.strip()
    try:
        prepared = _prepared(tmp_path / "run", "print('ran')")
        exit_ = SlurmProvider().launch(prepared, timeout=5)
    finally:
        on_slurm.run("scancel", blocker)
    job = (prepared.run_dir / "slurm" / "job_id").read_text().strip()
    said = [line for line in capsys.readouterr().err.splitlines()
            if line.startswith(f"stateset-backend: Slurm job {job} pending (")]
    assert len(said) >= 2 and "waited 0:0" in said[-1], said  # at once, then again
    reason = said[-1].split("pending (")[1].split(")")[0]  # the last one seen
    assert reason in ("Resources", "Priority")
    assert exit_.timed_out and exit_.reason == (
        f"the run's timeout cancelled the job (scancel) while it was still pending ({reason}) "
        "in the queue")
