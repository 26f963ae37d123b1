"""The engine itself, run where it can run here, held to the spec: the kit's one check that
does not take the adapter's word.

Every other check compares descriptions: the launch with its reader, the reader with the
surface, the stub's outputs with the collector. A wrong but self-consistent adapter passes all
of them. So where the adapter declares a rehearsal (``EngineAdapter.rehearse``) and the engine
is installed, the kit runs the engine's own trainer, through the same code as
``stateset-backend rehearse``, on a sample made to show what it does: four updates of a
shrunk model, three optimizer steps each, a cosine schedule after two warm-up updates,
validation every two updates ranked by a metric, a checkpoint every update keeping two, the KL
term where the release claims one, and data whose splits never share a prompt.
It then requires what the spec asks, as seen where the hub holds the pen (every check of
``runs.rehearsal``: the reward shim's calls, validation passes, the learning rate the engine
logged, the files it wrote, KL at update 1, the resume). Finally the kit's own picture of the
engine's outputs (the writer the collection checks use) must match the engine's: a writer that
invents an output the engine never makes certifies a collector against fiction.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
from pathlib import Path
from typing import Any

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks import CheckFailed, Writer
from stateset_backend.conformance.samples import REWARD_SOURCE, deep_merge, write_split
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import EngineAdapter, LaunchContext
from stateset_backend.engines.registry import entry_of
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.runs.rehearsal.run import Verdict, rehearse
from stateset_backend.runs.results import Result
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.inputs import BUILTIN_PREFIX, builtin_model_dir
from stateset_backend.translate.rules import explain_rows

UPDATES = 4
# three optimizer steps an update, where the release can split one: an engine (or a launch)
# that counts validation, checkpoints or its schedule in optimizer steps where the spec counts
# updates then validates, saves or warms up at the wrong time, which one step an update hides
# (and two would hide a rule that doubles where it should multiply by the steps)
UNITS = {"budget": {"mini_batches": 3}}
MODEL = "builtin:tiny-llama-support"
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# a few rows per split, from the support-routing scenario (whose splits never share a prompt),
# so the reward calls say which split was scored
ROWS = {"train": 32, "validation": 6, "test": 6}
TIMEOUT_S = 600.0
# what the engine must have shown for the kit to certify it; the rest may be "not measured"
REQUIRED = ("launch", "identity", "metrics finite", "reward calls", "validation",
            "checkpoints", "updates")


def write_files(root: Path, data_format: str) -> dict[str, str]:
    """The watched sample's data and reward under ``root``; their sha256 by relative path."""
    import hashlib

    from stateset_backend.native.scenarios.support_routing import generate

    splits = generate(0)
    sums: dict[str, str] = {}
    for name, rows in ROWS.items():
        sums.update(write_split(root, name, splits[name][:rows], data_format))
    (root / "reward.py").write_text(REWARD_SOURCE, encoding="utf-8")
    sums["reward.py"] = hashlib.sha256(REWARD_SOURCE.encode()).hexdigest()
    return sums


def watched_doc(adapter: EngineAdapter, version: str, base: dict[str, Any], root: Path,
                data_format: str) -> dict[str, Any]:
    """The base sample (the adapter's ``base`` merged) made to show what the engine does, with
    each setting only where the release claims it."""
    claimed = adapter.contract.provided(parse_version(version))
    sums = write_files(root, data_format)

    def split(name: str) -> dict[str, Any]:
        uri = f"data/{name}.{data_format}"
        return {"uri": uri, "sha256": sums[uri]}

    doc = copy.deepcopy(base)
    model = doc["model"].get("path", "")
    if not (model.startswith(BUILTIN_PREFIX) or (root / model).is_dir()):
        # a hub id: the shipped tiny model's config and tokenizer (with a chat template for
        # engines that render one), which `rehearse` builds seeded weights for
        shipped = builtin_model_dir(MODEL)
        assert shipped is not None
        shutil.copytree(shipped, root / "model", dirs_exist_ok=True)
        config = root / "model" / "tokenizer_config.json"
        tokenizer = json.loads(config.read_text(encoding="utf-8"))
        config.write_text(json.dumps({**tokenizer, "chat_template": CHAT_TEMPLATE}, indent=2),
                          encoding="utf-8")
        doc["model"] = {"path": "model"}
    if "dtype:float32" in claimed:
        doc["model"].update(dtype="float32")
        doc["model"].pop("param_dtype", None)
    doc["algorithm"]["group_size"] = 4 if doc["algorithm"].get("group_size", 1) > 1 else 1
    if "kl:loss" in claimed:
        doc["algorithm"]["kl"] = {"coef": 0.001, "estimator": "k3", "placement": "loss"}
    doc = deep_merge(doc, {
        "seed": 11,
        "data": {"train": split("train"), "test": split("test"), "max_prompt_tokens": 48,
                 "max_response_tokens": 4},
        "reward": {"kind": "python", "entrypoint": "reward.py:score",
                   "sha256": sums["reward.py"]},
        "optim": {"lr": 1e-3, "schedule": "cosine", "warmup_steps": 2, "min_lr_ratio": 0.1},
        "budget": {"total_updates": UPDATES, "prompts_per_update": 3},
        # one node, the devices the base sample asks (a CPU engine's base may ask none)
        "resources": {"nodes": 1}})
    if "validation" in claimed:
        doc["data"]["validation"] = split("validation")
        doc["evaluation"] = {"every": 2, "select_by": "val/reward/mean"}
    if "checkpoint" in claimed:
        # keep 2: the resume check needs update 3's checkpoint kept past update 4's save
        doc["checkpoint"] = {"every": 1, "keep": 2}
    return _unrefused(adapter, version, deep_merge(doc, UNITS))


def _unrefused(adapter: EngineAdapter, version: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without each of ``UNITS`` and ``evaluation.select_by`` the release refuses (the
    spec's default then: one step an update, no ranking), so a release that cannot split an
    update or rank its checkpoints still runs the rest."""
    dialect = adapter.contract.dialect(parse_version(version))
    try:
        rows = explain_rows(parse_spec(doc), adapter.rules(dialect), dialect, adapter.name)
    except Exception:  # the run's own planning reports it
        return doc
    optional = {*flatten(UNITS), "evaluation.select_by"}
    for row in rows:
        if row.state == "refused" and row.path in optional:
            *parents, last = row.path.split(".")
            functools.reduce(dict.__getitem__, parents, doc).pop(last)
    return doc


def run_engine(adapter: EngineAdapter, version: str, doc: dict[str, Any], root: Path, *,
               python: str | None) -> Verdict:
    """The engine's own run of ``doc`` through ``rehearse``, kept under ``root``."""
    entry = entry_of(adapter)
    plan = make_plan(parse_spec(doc, source="the kit's watched sample"), entry, version,
                     base_dir=root)
    return rehearse(plan, entry, root / "runs", UPDATES, python=python, engine_home=None,
                    timeout=TIMEOUT_S, echo_stderr=False, live_progress=False)


def check_verdict(found: Verdict) -> list[str]:
    """Every line of the engine's run holds, and each required one was measured; returns the
    lines, for the report."""
    shown = [f"{line.state:<12} {line.check}: {line.detail}" for line in found.lines]
    failed = [line for line in found.lines if line.state == "FAILED"]
    unmeasured = [line for line in found.lines
                  if line.check in REQUIRED and line.state != "ok"]
    if failed or unmeasured:
        first = (failed or unmeasured)[0]
        tail = "; ".join(first.tail[-3:])
        raise CheckFailed(f"the engine's own run of the watched sample ({found.folder}): "
                          f"{first.check}: {first.detail}" + (f" [{tail}]" if tail else "")
                          + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""))
    return shown


def check_writer_matches(adapter: EngineAdapter, found: Verdict, writer: Writer,
                         tmp: Path) -> int:
    """The kit's writer, given the metrics the engine logged, writes outputs the engine's own
    run has: every artifact kind, and every metric under the engine's own name. Returns how
    many things were compared."""
    result = Result.load(found.folder / "result.json")
    engine_kinds = {a.kind for a in result.artifacts}
    engine_names = dict(result.metrics.raw_names)
    plan: LaunchPlan = found.plan
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    rows = [{"step": s, "reward/mean": 0.25, "loss/policy": 0.5, "kl": 0.0}
            for s in range(1, UPDATES + 1)]
    attempt = tmp / "written"
    attempt.mkdir(parents=True)
    writer(attempt, ctx, metrics=rows, identity=True, artifacts=True, checkpoint_step=2)
    try:
        written = adapter.collect(attempt, ctx)
    except Exception as exc:  # the adapter's own error is the finding
        raise CheckFailed(f"collecting what the kit's writer wrote fails: {exc}") from None
    invented = sorted({a.kind for a in written.artifacts} - engine_kinds)
    if invented:
        raise CheckFailed(f"the kit's writer for {adapter.name} writes {invented} artifacts, "
                          f"which the engine's own run never wrote (it wrote "
                          f"{sorted(engine_kinds)}): the collection checks would certify "
                          "outputs this engine does not make")
    compared = len(engine_kinds)
    for canonical, raw in written.raw_metric_names.items():
        if canonical in engine_names and engine_names[canonical] != raw:
            raise CheckFailed(f"the kit's writer logs {canonical} as {raw!r}; the engine's own "
                              f"run logs it as {engine_names[canonical]!r}")
        compared += canonical in engine_names
    return compared
