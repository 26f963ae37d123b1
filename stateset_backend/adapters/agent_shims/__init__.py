"""Fixed modules that adapt the engine-neutral environment (docs/environments.md) to each
external engine's own multi-turn interface.

They are copied verbatim into the run directory and run in the engine's interpreter, where
stateset-backend is not installed: each imports only the standard library, the engine, and
``stateset_environment`` (the environment protocol, ``spec/environment_protocol.py``, copied
beside it; the native engine imports the same module in process). Nothing from the spec is
ever written into them; the launch writes the settings as JSON (``stateset_conversation.json``)
and the shims read it.
"""

from __future__ import annotations

from importlib import resources

PROTOCOL_FILE = "environment_protocol.py"
# package file -> the module name it has in the run directory
SHIM_MODULES = {
    PROTOCOL_FILE: "stateset_environment",
    "verl_agent_loop.py": "stateset_verl_agent",
    "openrlhf_agent.py": "stateset_openrlhf_agent",
    "nemo_rl_environment.py": "stateset_nemo_rl_environment",
}
CONFIG_FILE = "stateset_conversation.json"
# names the shims define for themselves (they import nothing from here; a test checks these)
NEMO_RL_ENV = "stateset_environment"  # nemo_rl_environment.ENV_NAME
NEMO_RL_PROCESSOR = "stateset_conversation"  # nemo_rl_environment.PROCESSOR_NAME
VERL_AGENT_NAME = "stateset_environment"  # verl_agent_loop.AGENT_NAME
VERL_AGENT_TARGET = "stateset_verl_agent.StatesetAgentLoop"  # verl_agent_loop.TARGET


def shim_source(package_file: str) -> str:
    """The text of one shim module, as it is copied into the run directory."""
    package = "stateset_backend.spec" if package_file == PROTOCOL_FILE else __package__
    return resources.files(package).joinpath(package_file).read_text(encoding="utf-8")


def shim_files(engine_file: str) -> dict[str, str]:
    """Run-directory file name -> text, for the shared module and one engine's shim."""
    return {f"{SHIM_MODULES[name]}.py": shim_source(name)
            for name in (PROTOCOL_FILE, engine_file)}
