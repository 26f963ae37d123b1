"""Shared fixtures: specs built in code, and the CLI run in-process or as a real subprocess."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, MINIMAL

# One torch thread in each test process and in each engine it starts: the suite runs one
# worker per core, so a second thread per process only oversubscribes the cores, and OpenMP's
# spin-waits then burn the time the other worker needed. A test that sets its own count wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # set before its first parallel region, which reads the variable
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "plugins"
# Plugins that exist to be tested (one of them is broken on purpose): the suite loads them as
# real distributions through entry points, but never installs them where users work.
TEST_PLUGINS = ("stateset-echo-engine", "stateset-broken-plugin")
_session_site: Path | None = None
SITE_ENV = "STATESET_TEST_PLUGIN_SITE"


def _distribution_site(root: Path, projects: list[Path]) -> None:
    """A folder that Python's import system and importlib.metadata read like site-packages.

    Each project's packages are linked in beside a dist-info holding its name, version and
    entry points, all taken from its pyproject.toml, so discovery runs exactly as it does
    after `pip install`.
    """
    for project in projects:
        meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
        info = meta["project"]
        for package in meta["tool"]["setuptools"]["packages"]:
            (root / package).symlink_to(project / package, target_is_directory=True)
        dist_info = root / f"{info['name'].replace('-', '_')}-{info['version']}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {info['name']}\nVersion: {info['version']}\n",
            encoding="utf-8")
        lines = []
        for group, points in info.get("entry-points", {}).items():
            lines.append(f"[{group}]")
            lines += [f"{name} = {target}" for name, target in points.items()]
        (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def pytest_configure(config: pytest.Config) -> None:
    """Put the test plugins on the path of this process and of every CLI it starts."""
    global _session_site
    if hasattr(config, "workerinput"):
        # a pytest-xdist worker: its controller made the folder and set PYTHONPATH, which this
        # worker and its CLIs inherit, but xdist gives the worker the controller's first sys.path
        sys.path.insert(0, os.environ[SITE_ENV])
        return
    _session_site = Path(tempfile.mkdtemp(prefix="stateset-test-plugins-"))
    os.environ[SITE_ENV] = str(_session_site)
    _distribution_site(_session_site, [EXAMPLES / name for name in TEST_PLUGINS])
    sys.path.insert(0, str(_session_site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(_session_site), *filter(None, [os.environ.get("PYTHONPATH")])])


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_site is not None:
        shutil.rmtree(_session_site, ignore_errors=True)


@pytest.fixture
def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


@pytest.fixture
def minimal_with_files(minimal, tmp_path: Path) -> dict[str, Any]:
    """The minimal spec with its train split and reward written beside it (two rows, a reward
    of 1) and their hashes in the spec: a spec that plans for any engine that takes jsonl."""
    from stateset_backend.spec.content import sha256_file

    (tmp_path / "data").mkdir()
    train = tmp_path / "data" / "train.jsonl"
    train.write_text('{"prompt": "p", "answer": "a"}\n' * 2)
    reward = tmp_path / "reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return 1.0\n")
    minimal["data"]["train"]["sha256"] = sha256_file(train)
    minimal["reward"]["sha256"] = sha256_file(reward)
    return minimal


@pytest.fixture
def grpo(tmp_path: Path) -> dict[str, Any]:
    """The external GRPO example (examples/external/grpo.json) beside a copy of its data in
    ``tmp_path``, so its relative paths resolve when a test plans it there."""
    external = EXAMPLES.parent / "external"
    shutil.copytree(external / "data", tmp_path / "data")
    return json.loads((external / "grpo.json").read_text())


@pytest.fixture
def engine_reads() -> Any:
    """What a built-in engine reads from a plan, through the kit's own reader of it."""
    from stateset_backend.conformance.readers import reader_for

    def read(plan: Any) -> dict[str, Any]:
        reader = reader_for(plan.engine, None)
        assert reader is not None
        return reader(plan)

    return read


@pytest.fixture
def explained() -> Any:
    """How a built-in engine release translates one leaf of a spec: its ``explain`` row."""
    from packaging.version import Version

    from stateset_backend.engines.registry import build_registry
    from stateset_backend.translate.rules import explain_rows

    def row(spec: Any, engine: str, version: str, path: str) -> Any:
        adapter = build_registry().get(engine).adapter
        dialect = adapter.contract.dialect(Version(version))
        return next(r for r in explain_rows(spec, adapter.rules(dialect), dialect, engine)
                    if r.path == path)

    return row


@pytest.fixture
def write_json(tmp_path: Path):
    def write(doc: Any, name: str = "spec.json") -> Path:
        path = tmp_path / name
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
        return path

    return write


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: a fresh interpreter, real exit code, real stderr."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "stateset_backend", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_in_process(capsys: pytest.CaptureFixture[str]) -> Any:
    """The CLI's ``main`` called in this process, returning what ``run_cli`` returns: for
    commands whose test needs no fresh interpreter (bad input, screens, JSON), without a
    subprocess's start-up."""
    from stateset_backend.cli import main

    def run(*args: Any) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([str(a) for a in args], code, out, err)

    return run


@pytest.fixture(params=["dapo", "ppo"])
def full(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A spec with every optional section set (two of them: gae is PPO-only)."""
    return copy.deepcopy(FULL_DAPO if request.param == "dapo" else FULL_PPO)

