"""OpenRLHF runs the spec's environment through the generated agent executor.

For the first and last release (0.9.8, 0.11.2): the multi-turn plan of
examples/external/support-agent.json goes through the release's own parser; the executor is
loaded by the release's own ``_load_agent_executor`` (read from its vllm_engine.py) from the
run folder, must subclass the release's ``AgentExecutorBase``, and a scripted support
conversation goes through it with a stand-in vLLM engine answering each turn; the result is
turned into an experience by the release's own ``_process_response_into_experience``. The
wheel's sources are imported as they are; only the package ``__init__`` files, which import
unrelated math and GPU modules, are bypassed. Needs STATESET_TEST_OPENRLHF_WHEELS.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from agent_shim_fixtures import REWARDS, SCRIPT, TASK, bad_environment, tokenizer
from optional_installs import OPENRLHF_WHEELS_MISSING

from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

WHEELS = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
PARSER = Path(__file__).with_name("openrlhf_parse.py")
VERSIONS = ["0.9.8", "0.11.2"]
needs_wheels = pytest.mark.skipif(WHEELS is None, reason=OPENRLHF_WHEELS_MISSING)


def _plan(version: str):
    entry = AdapterEntry(OpenRLHFAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(load_spec(EXAMPLES / "support-agent.json"), entry, version,
                     base_dir=EXAMPLES)


def _wheel(version: str) -> Path:
    (wheel,) = Path(WHEELS or "").glob(f"openrlhf-{version}-*.whl")
    return wheel


@needs_wheels
@pytest.mark.parametrize("version", VERSIONS)
def test_multi_turn_argv_passes_the_releases_parser(version, tmp_path):
    plan = _plan(version)
    assert plan.argv[:2] == ["{python}", "{run_dir}/stateset_openrlhf_agent.py"]
    argv = [a.replace("{run_dir}", str(tmp_path)) for a in plan.argv[2:]]
    proc = subprocess.run([sys.executable, str(PARSER), str(_wheel(version)), "--", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads(proc.stdout.strip().splitlines()[-1])
    flat = version == "0.9.8"

    def v(flat_name: str, dotted: str):
        return args[flat_name if flat else dotted]

    assert v("agent_func_path", "train.agent_func_path") == \
        f"{tmp_path}/stateset_openrlhf_agent.py"
    assert v("remote_rm_url", "reward.remote_url") in ("agent", ["agent"])  # set by OpenRLHF
    assert (v("max_len", "data.max_len"), v("max_new_tokens", "rollout.max_new_tokens")) == \
        (1024, 128)  # the total and the turn limit
    assert (v("input_key", "data.input_key"), v("label_key", "data.label_key")) == \
        ("prompt", "stateset_task")
    assert v("prompt_data", "data.prompt_dataset") == f"{tmp_path}/data/train.jsonl"


def _release(version: str, folder: Path) -> Path:
    """The wheel's ``openrlhf`` sources, unpacked."""
    with zipfile.ZipFile(_wheel(version)) as zf:
        for name in zf.namelist():
            if "/openrlhf/" in name and name.endswith(".py"):
                target = folder / name[name.index("openrlhf/"):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    return folder / "openrlhf"


def _function(source: Path, name: str, namespace: dict) -> object:
    """One function (or class) of a release's module, compiled from its source alone (its
    module imports vLLM and Ray, which need a GPU machine)."""
    tree = ast.parse(source.read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)
              and n.name == name)
    exec(compile(ast.Module([fn], []), str(source), "exec"), namespace)
    return namespace[name]


def _definitions(source: Path, namespace: dict) -> None:
    """A release module's own top-level definitions, without its imports (vLLM, Ray) and
    without the statements that need them."""
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            continue
        try:
            exec(compile(ast.Module([node], []), str(source), "exec"), namespace)
        except NameError:
            assert not isinstance(node, ast.ClassDef) or node.name != "Experience"


@pytest.fixture
def release(request, tmp_path, monkeypatch):
    """The release's packages importable without their ``__init__`` side imports."""
    root = _release(request.param, tmp_path / "wheel")
    for package in ("openrlhf", "openrlhf.utils", "openrlhf.trainer",
                    "openrlhf.trainer.ppo_utils"):
        module = types.ModuleType(package)
        module.__path__ = [str(root.parent / package.replace(".", "/"))]
        monkeypatch.setitem(sys.modules, package, module)
    for name in [m for m in sys.modules if m.startswith("openrlhf.")]:
        if name not in ("openrlhf.utils", "openrlhf.trainer", "openrlhf.trainer.ppo_utils"):
            monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delitem(sys.modules, "stateset_environment", raising=False)
    return request.param, root


class SamplingParams(SimpleNamespace):
    """The attributes OpenRLHF's dispatcher sets on vLLM's SamplingParams."""


class Engine:
    """vLLM's engine as OpenRLHF's executor calls it, answering with the script."""

    def __init__(self, tok):
        self.tok, self.asks = tok, []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        turn = len(self.asks)
        self.asks.append({"prompt": list(prompt_token_ids),
                          "max_tokens": sampling_params.max_tokens})
        ids = self.tok(SCRIPT[turn], add_special_tokens=False)["input_ids"] + \
            [self.tok.eos_token_id]
        logprobs = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
        text = self.tok.decode(ids, skip_special_tokens=False)
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text=text,
                                                        finish_reason="stop",
                                                        logprobs=logprobs)])


def _execute(version, root, tmp_path, bad=False):
    plan = _plan(version)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, text in plan.files.items():
        (run_dir / name).write_text(text)
    if bad:
        settings = json.loads((run_dir / "stateset_conversation.json").read_text())
        path = bad_environment(tmp_path / "env", "return {'observations': [], 'done': True}")
        settings["environment"] = {"path": str(path), "class": "Bad",
                                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        (run_dir / "stateset_conversation.json").write_text(json.dumps(settings))
    sys.path.insert(0, str(run_dir))
    try:
        import importlib

        base = importlib.import_module("openrlhf.utils.agent").AgentExecutorBase
        load = _function(root / "trainer" / "ray" / "vllm_engine.py", "_load_agent_executor",
                         {"AgentExecutorBase": base})
        executor = load(str(run_dir / "stateset_openrlhf_agent.py"))
        assert isinstance(executor, base)
        tok = tokenizer(tmp_path / "tokenizer")
        # the launcher half converts the split; the label is the converted row's stateset_task
        agent = importlib.import_module("stateset_openrlhf_agent")
        agent.prepare(run_dir)
        row = json.loads((run_dir / "data" / "train.jsonl").read_text().splitlines()[0])
        engine = Engine(tok)
        params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=128,
                                min_tokens=1, skip_special_tokens=False, logprobs=1)
        output = asyncio.run(executor.execute("rendered prompt", row["stateset_task"], params,
                                              1024, tok, engine))
        return output, engine, tok, run_dir
    finally:
        sys.path.remove(str(run_dir))
        for name in ("stateset_openrlhf_agent", "stateset_environment"):
            sys.modules.pop(name, None)


@needs_wheels
@pytest.mark.slow
@pytest.mark.parametrize("release", VERSIONS, indirect=True)
def test_scripted_conversation_through_openrlhfs_agent_interface(release, tmp_path):
    version, root = release
    output, engine, tok, _ = _execute(version, root, tmp_path)
    assert json.loads(output["label"]) == TASK
    assert output["reward"] == pytest.approx(sum(REWARDS)) == output["scores"]
    assert [a["max_tokens"] for a in engine.asks] == [128] * len(SCRIPT)  # the turn limit
    tokens, ranges = output["observation_tokens"], output["action_ranges"]
    script = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
              for t in SCRIPT]
    assert [tokens[a:b] for a, b in ranges] == script
    assert "Tools:" in tok.decode(tokens[:ranges[0][0]])  # the opening with the tools
    # each turn was generated from everything before it
    assert [a["prompt"] for a in engine.asks] == [tokens[:a] for a, _ in ranges]
    # the release's own conversion: loss only on the sampled tokens
    import dataclasses
    import typing

    import torch

    sources = sorted((root / "trainer" / "ppo_utils").glob("*.py"))
    namespace = {"torch": torch, **{n: getattr(dataclasses, n) for n in
                                    ("dataclass", "field", "fields")},
                 **{n: getattr(typing, n) for n in ("Any", "List", "Optional", "Union")}}
    experience = next(p for p in sources if "class Experience" in p.read_text())
    _definitions(experience, namespace)  # the release's own Experience dataclass
    source = next(p for p in sources if "def _process_response_into_experience" in
                  p.read_text())
    convert = _function(source, "_process_response_into_experience", namespace)
    experience = convert(None, output, max_len=1024)
    mask = experience.action_mask[0].tolist()
    sequence = experience.sequences[0].tolist()
    trained = [sequence[i + 1] for i, m in enumerate(mask) if m]  # mask is shifted by one
    assert trained == [t for ids in script for t in ids]
    assert float(experience.rewards[0]) == pytest.approx(sum(REWARDS))
    rollout = experience.rollout_log_probs[0].tolist()
    assert [rollout[i] for i, m in enumerate(mask) if m] == [-0.5] * len(trained)


@needs_wheels
@pytest.mark.parametrize("release", ["0.11.2"], indirect=True)
def test_malformed_environment_stops_openrlhfs_rollout_recorded(release, tmp_path):
    version, root = release
    with pytest.raises(Exception, match="max_failed_share is 0") as exc:
        _execute(version, root, tmp_path, bad=True)
    assert "step returned reward None, not a finite number" in str(exc.value)
    record = json.loads((tmp_path / "run" / "environment-failures.jsonl").read_text())
    assert record["task"] == TASK and record["turns"] == 0
