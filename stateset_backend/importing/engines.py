"""Where each engine's launch starts in a script, and how its settings are read.

Each engine is read the way it reads itself, through the conformance kit's launch readers:
Hydra's override grammar for verl and NeMo RL, the release's own argparse parser (rebuilt from
its generated surface) for OpenRLHF. Only what the readers cannot know lives here: which word
of a script starts the engine, and which key names the reward function the engine imports.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance import readers
from stateset_backend.contracts.surfaces import surface
from stateset_backend.importing.shell import Script, command_of, looks_like_script, read_script


@dataclass
class Launch:
    """An engine launch as the engine reads it: every key it sets, which word set it, and
    what the import could not read or would not carry."""

    engine: str
    version: str
    settings: dict[str, Any]  # key -> value, as the engine's parser reads it
    words: dict[str, str]  # key -> the word (or YAML line) that set it
    refused: dict[str, str] = field(default_factory=dict)  # word -> why it is not read
    notes: list[str] = field(default_factory=list)  # shell expansions, dropped commands


def _plan_like(argv: list[str], version: str) -> Any:
    """The readers take a plan and read only its argv and release: the import hands them the
    input's words the same way, so input and round trip are read by one reader."""
    return cast(Any, types.SimpleNamespace(argv=argv, engine_version=version, files={}))


def _script_words(text: str, engine: str, is_engine: Callable[[str], bool],
                  what: str, source: str) -> tuple[list[str], Script | None]:
    """The words after the engine's entry point in a script; an overrides file's words as
    they are."""
    if not looks_like_script(text):
        script = read_script(text)
        return [w for words in script.commands for w in words], script
    script = read_script(text)
    found = command_of(script, is_engine)
    if found is None:
        raise InvalidInput(f"{source}: no {engine} command ({what}) in the script")
    words, start = found
    return words[start:], script


def _shell_notes(script: Script | None) -> list[str]:
    if script is None:
        return []
    return [f"shell: {line}" for line in script.unresolved] + \
        [f"shell: {line}" for line in script.substituted]


# -- verl and NeMo RL: Hydra overrides ------------------------------------------------------
def _verl_entry(word: str) -> bool:
    return word in ("verl.trainer.main_ppo",) or word.endswith("verl/trainer/main_ppo.py")


def read_hydra(engine: str, words: list[str], version: str,
               reader: Callable[[Any], dict[str, Any]]) -> Launch:
    """Each override through the engine's reader alone (which key it sets), then all of them
    together (the values the engine reads, interpolations resolved)."""
    launch = Launch(engine, version, {}, {})
    kept: list[str] = []
    for word in words:
        if word.startswith("-"):
            launch.refused[word] = ("a Hydra command-line flag: the import reads the release's "
                                    "own config, composed as the hub launches it")
            continue
        if "=" not in word:
            launch.refused[word] = "not an override (key=value)"
            continue
        if word.startswith("~"):
            launch.refused[word] = ("deletes a key of the engine's config (~): the hub launches "
                                    "the release's config whole")
            continue
        if word.split("=", 1)[0].lstrip("+").split(".", 1)[0] == "hydra":
            launch.refused[word] = ("configures Hydra's launcher (its output folders), not "
                                    "the engine")
            continue
        try:
            keys = reader(_plan_like([word], version))
        except readers.LaunchUnreadable:  # alone it may interpolate another override
            keys = {word.split("=", 1)[0].lstrip("+"): None}
        except Exception as exc:  # OmegaConf's own errors, for one word
            launch.refused[word] = f"{engine}'s config parser refuses it: {exc}"
            continue
        if not word.startswith("+"):
            _known(engine, version, word.split("=", 1)[0])
        for key in keys:
            launch.words[key] = word
        kept.append(word)
    try:
        launch.settings = reader(_plan_like(kept, version))
    except readers.LaunchUnreadable as exc:
        raise InvalidInput(str(exc)) from None
    except Exception as exc:
        raise InvalidInput(f"{engine}'s config parser refuses the launch: {exc}") from None
    for key in launch.settings:
        launch.words.setdefault(key, key)
    return launch


def _known(engine: str, version: str, key: str) -> None:
    """Hydra refuses to override a key the release's config does not have (a ``+`` adds one),
    so the engine would not start: the import refuses the launch the same way."""
    shipped = surface(engine, version)
    if shipped is None:
        return
    known = shipped["options"]
    if key in known or any(k.startswith(key + ".") for k in known) or any(
            key.startswith(k + ".") and isinstance(known[k].get("default"), dict)
            for k in _parents(key) if k in known):
        return
    raise InvalidInput(f"{key}: {engine} {version}'s config has no such key, so Hydra refuses "
                       "the override (+key=value adds a new one)")


def _parents(key: str) -> list[str]:
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def read_verl(text: str, version: str, source: str) -> Launch:
    words, script = _script_words(text, "verl", _verl_entry,
                                  "python -m verl.trainer.main_ppo", source)
    launch = read_hydra("verl", words, version, readers.verl)
    launch.notes = _shell_notes(script)
    return launch


# -- OpenRLHF: the release's argparse ---------------------------------------------------------
OPENRLHF_ENTRY = "openrlhf.cli.train_ppo_ray"


def _openrlhf_entry(word: str) -> bool:
    return word == OPENRLHF_ENTRY or word.endswith("openrlhf/cli/train_ppo_ray.py")


def read_openrlhf(text: str, version: str, source: str) -> Launch:
    words, script = _script_words(text, "OpenRLHF", _openrlhf_entry,
                                  f"python -m {OPENRLHF_ENTRY}", source)
    argv = ["-m", OPENRLHF_ENTRY, *words]
    try:
        settings = readers.openrlhf(_plan_like(argv, version))
    except readers.LaunchUnreadable as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    launch = Launch("openrlhf", version, settings, {})
    for key in settings:  # the word that names it, abbreviated or not
        launch.words[key] = next((w for w in words if w.startswith("--") and
                                  key.startswith(w.split("=", 1)[0])), key)
    launch.notes = _shell_notes(script)
    return launch


# -- NeMo RL: a YAML config, then Hydra overrides ---------------------------------------------
def read_nemo_rl(text: str, version: str, source: str,
                 overrides: list[str] | None = None) -> Launch:
    """A NeMo RL config file (the keys it sets, as OmegaConf loads YAML) and any overrides
    after it, read as NeMo RL reads them: the config, then the overrides through Hydra."""
    yaml = _yaml()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not any(k in doc for k in ("grpo", "policy", "loss_fn")):
        raise InvalidInput(f"{source}: not a NeMo RL config (no grpo, policy or loss_fn "
                           "section)")
    launch = Launch("nemo-rl", version, {}, {})
    if "defaults" in doc:
        launch.notes.append(f"defaults: {doc.pop('defaults')!r}: the file extends another "
                            "config; only the keys it sets itself are imported")
    words = [f"{k}={_override_value(v)}" for k, v in flatten(doc).items()]
    both = read_hydra("nemo-rl", [*words, *(overrides or [])], version, readers.nemo_rl)
    launch.settings, launch.refused = both.settings, both.refused
    launch.words = {k: (w if w in (overrides or []) else f"{k}: {flatten(doc).get(k)!r}")
                    for k, w in both.words.items()}
    return launch


def _override_value(value: Any) -> str:
    """A YAML value written as Hydra reads an override value back to the same thing."""
    import json

    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if value is None:
        return "null"
    if isinstance(value, dict) and not value:
        return "{}"
    return json.dumps(value)


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise Unsupported("reading YAML needs pyyaml (pip install pyyaml)") from None
    return yaml


READERS: dict[str, Callable[[str, str, str], Launch]] = {
    "verl": read_verl, "openrlhf": read_openrlhf, "nemo-rl": read_nemo_rl}

# The function name an engine calls in a reward file when the launch names none.
REWARD_FUNCTION = {"verl": "compute_score", "openrlhf": "reward_func"}


def read_file(engine: str, path: Path, version: str, overrides: list[str] | None = None) -> \
        Launch:
    reader = READERS.get(engine)
    if reader is None:
        raise Unsupported(f"import reads verl, OpenRLHF and NeMo RL launches, not {engine}")
    if overrides and engine != "nemo-rl":
        raise InvalidInput("--override is for a NeMo RL config; a script's overrides are read "
                           "from the script")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    if engine == "nemo-rl":
        return read_nemo_rl(text, version, str(path), overrides)
    return reader(text, version, str(path))
