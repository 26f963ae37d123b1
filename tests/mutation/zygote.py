"""A process that imports the kit's third-party dependencies once, then forks one child per
kit run: each child imports the mutated package fresh from its own copy (the zygote never
imports ``stateset_backend`` or the TRL plugin), but not pytest, pydantic, Hydra, pandas or
TRL, whose imports cost a mutant's run more than most of the checks that kill it.

The parent (``mutation_run``) writes one JSON request a line: ``{"argv", "cwd", "env",
"path", "stdout", "stderr", "timeout"}``; the zygote answers ``{"exit": code}`` once the
child is done (``TIMED_OUT`` when it ran past ``timeout`` and was killed with its process
group; a negative code is the signal that ended it).

    python tests/mutation/zygote.py [--trl]
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
import traceback

# what the kit imports that is not ours: every engine's run needs these
PRELOAD = ("pydantic", "jsonschema", "pluggy", "packaging.version", "packaging.specifiers",
           "rfc8785", "yaml", "pytest", "_pytest.python", "_pytest.runner", "xdist",
           "hypothesis", "hydra", "hydra.core.override_parser.overrides_parser", "omegaconf",
           "pandas", "pyarrow.parquet", "torch", "safetensors.torch",
           "torch.utils.tensorboard", "tensorboard.backend.event_processing.event_accumulator",
           "tensorboard.plugins.hparams.metadata")
TIMED_OUT = -999  # not an exit status: the run was ended at its timeout
# the TRL plugin reads its configuration surface from TRL's own GRPOConfig
TRL_PRELOAD = ("trl.trainer.grpo_config", "transformers", "peft", "datasets")


def _preload(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # not installed here: the child imports what it needs itself
    assert not any(m.startswith(("stateset_backend", "stateset_trl_engine"))
                   for m in sys.modules), "the zygote must not import the package it mutates"


def _child(request: dict) -> int:
    # its own process group, so a timeout ends whatever the kit started (stubs, interpreters)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.dont_write_bytecode = os.environ.get("PYTHONDONTWRITEBYTECODE") == "1"
    sys.path[:0] = request["path"]
    importlib.invalidate_caches()
    # the zygote's stdin carries the requests: nothing the kit starts may read them
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["stateset_backend", *request["argv"]]
    try:
        from stateset_backend.cli import main

        main()
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1


def _run(request: dict) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(request)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + request["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return TIMED_OUT
        time.sleep(0.02)


def serve() -> None:
    _preload(PRELOAD + (TRL_PRELOAD if "--trl" in sys.argv else ()))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"exit": _run(json.loads(line))}), flush=True)


if __name__ == "__main__":
    serve()
