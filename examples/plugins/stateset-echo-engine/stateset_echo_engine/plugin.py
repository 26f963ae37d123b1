"""The plugin: one adapter registered through stateset-backend's hook."""

from __future__ import annotations

import json
from pathlib import Path

from stateset_backend.plugin import (
    CORE_HANDLED,
    PYTHON,
    RUN_DIR,
    Artifact,
    Collected,
    Dialect,
    EngineAdapter,
    ExperimentSpec,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    RuleSet,
    Translation,
    all_leaf_paths,
    hookimpl,
    inert_reason,
    log_rows,
    na,
    to,
)


class EchoAdapter(EngineAdapter):
    name = "echo"
    contract_package = "stateset_echo_engine"
    contract_file = "contract.json"

    def rules(self, dialect: Dialect) -> RuleSet:
        # The echo engine is handed every setting (it records them in echo.json) and trains
        # nothing; that is what it is for: proving discovery, launch and collection.
        rules = {path: to(path) for path in all_leaf_paths(ExperimentSpec)
                 if path not in CORE_HANDLED}
        return rules | {"name": na("the echo engine names nothing"),
                        "resources": na("one local process"),
                        "budget.total_updates": to(dialect.keys["updates"])}

    def kit_support(self) -> KitSupport:
        return KitSupport(write_outputs=write_outputs, parse_launch=read_launch,
                          surface=surface(), engine_stub=ENGINE_STUB,
                          expectations=EXPECTATIONS, math_keys=MATH_KEYS)

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        native = dict(translation.native)
        settings = {k: native.pop(k) for k in list(native) if not k.startswith("--")
                    and k not in ("seed", "behaviour")}
        argv = [PYTHON, "-m", "stateset_echo_engine.engine", "--out", RUN_DIR,
                "--run-id", ctx.run_id, "--digest", ctx.experiment_digest,
                "--updates", str(native.pop("--updates")), "--seed", str(native.pop("seed"))]
        if "behaviour" in native:  # an engine option; the engine behaves well without it
            argv += ["--behaviour", str(native.pop("behaviour"))]
        return NativeLaunch(argv=argv, set_env={"ECHO_MARKER": f"{RUN_DIR}/marker"},
                            files={"echo.json": json.dumps(settings, sort_keys=True)})

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        out = Collected(raw_metric_names={"reward/mean": "score"})
        ident = attempt_dir / "identity.json"
        if ident.is_file():
            doc = json.loads(ident.read_text())
            out.run_id, out.experiment_digest = doc["run_id"], doc["digest"]
        rows = log_rows((attempt_dir / "log.jsonl").read_text()) \
            if (attempt_dir / "log.jsonl").is_file() else []
        for row in rows:
            out.metrics.append({"step": row["update"], "reward/mean": row["score"]})
        # updates, not log rows: the highest update any row reports
        out.committed_updates = max((r["step"] for r in out.metrics), default=0)
        if (attempt_dir / "weights.bin").is_file():
            out.artifacts.append(Artifact("weights.bin", "model", out.committed_updates))
        return out


# what the echo engine's run depends on, whatever else it records: every launch sets them
MATH_KEYS = ("--updates", "seed", "optim.lr", "algorithm.group_size",
             "budget.prompts_per_update", "rollout.temperature")


def _setting(path: str):
    """What the echo engine reads under a setting's own name: the spec's value (the engine
    records every experiment setting in echo.json as the spec names it)."""
    def expect(spec: ExperimentSpec):
        if (path.startswith("environment.") and path != "environment.kind" and \
                spec.environment.kind == "single_turn") or inert_reason(spec, path):
            return None  # a setting this spec makes moot is not recorded
        node = spec.model_dump(mode="json")
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return None if isinstance(node, dict) else node  # a section: its leaves are read

    return expect


# what the engine reads for a spec, from the engine's own description (not the rules above):
# every setting but the run's name and labels
NOT_READ = ("name", "labels")
EXPECTATIONS = (*(((path,), _setting(path)) for path in all_leaf_paths(ExperimentSpec)
                  if path not in CORE_HANDLED and path.split(".")[0] not in NOT_READ
                  and path != "budget.total_updates"),
                (("--updates",), lambda spec: spec.budget.total_updates))


def write_outputs(attempt: Path, ctx: LaunchContext, *, metrics: list[dict], identity: bool,
                  artifacts: bool, checkpoint_step: int | None) -> None:
    """What the echo engine leaves in an attempt folder, from canonical values, for the
    conformance kit: identity.json, log.jsonl and weights.bin."""
    if identity:
        (attempt / "identity.json").write_text(json.dumps(
            {"run_id": ctx.run_id, "digest": ctx.experiment_digest}))
    (attempt / "log.jsonl").write_text("".join(
        json.dumps({"update": r["step"], "score": r["reward/mean"]}) + "\n" for r in metrics))
    if artifacts:
        (attempt / "weights.bin").write_bytes(b"\0" * 64)


@hookimpl
def register_adapters(register):
    register(EchoAdapter())


def surface() -> dict:
    """Every key the echo engine reads: its flags, and any spec setting in echo.json."""
    from .launch_args import parser

    flags = {a.option_strings[0]: {"default": a.default} for a in parser()._actions
             if a.option_strings and a.option_strings[0] != "-h"}
    settings = {path: {"default": None} for path in all_leaf_paths(ExperimentSpec)}
    return {"options": {**flags, "seed": {"default": None}, **settings}}


# The echo engine's entry point, for the kit's launch-run check: the package's other modules
# stay the installed ones (the launch's own parser among them); the stub reads the launch as
# the engine does and reports what it received (the echo engine calls no reward).
ENGINE_STUB = {
    "stateset_echo_engine/__init__.py":
        "import pkgutil\n__path__ = pkgutil.extend_path(__path__, __name__)\n",
    "stateset_echo_engine/engine.py": """
import sys
from pathlib import Path

from stateset_echo_engine.launch_args import read_launch
from stateset_kit_stub import received

argv = sys.argv[1:]
out = Path(argv[argv.index("--out") + 1])
received(argv=argv, config=read_launch(argv, {"echo.json": (out / "echo.json").read_text()}))
""",
}


def read_launch(plan) -> dict:
    """The launch as the engine reads it (its own parser), for the conformance kit."""
    from .launch_args import read_launch as engine_reads

    start = plan.argv.index("stateset_echo_engine.engine") + 1
    return engine_reads(plan.argv[start:], plan.files)
