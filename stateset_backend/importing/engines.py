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
               reader: Callable[[Any], dict[str, Any]], trusted: int = 0) -> Launch:
    """Each override through the engine's reader alone (which key it sets), then all of them
    together (the values the engine reads, interpolations resolved). The first ``trusted``
    words are the release's own config, written by the hub from its surface: they are only
    composed."""
    launch = Launch(engine, version, {}, {})
    kept: list[str] = list(words[:trusted])
    for word in words[trusted:]:
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
            if not _interpolates(exc):
                launch.refused[word] = f"{engine}'s config parser refuses it: {exc}"
                continue
            keys = {word.split("=", 1)[0].lstrip("+"): None}
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


def _interpolates(exc: Exception) -> bool:
    """OmegaConf failing to resolve one word read alone: it names keys the other words set
    (NeMo RL's ``${mul:${policy...}}``), and the words read together decide."""
    try:
        from omegaconf.errors import InterpolationResolutionError
    except ImportError:
        return False
    return isinstance(exc, InterpolationResolutionError)


def _known(engine: str, version: str, key: str) -> None:
    """Hydra refuses to override a key the release's config does not have (a ``+`` adds one),
    so the engine would not start: the import refuses the launch the same way."""
    if not has_key(engine, version, key):
        raise InvalidInput(f"{key}: {engine} {version}'s config has no such key, so Hydra "
                           "refuses the override (+key=value adds a new one)")


def has_key(engine: str, version: str, key: str) -> bool:
    """Whether the release's config has the key, or a free mapping it lies in."""
    shipped = surface(engine, version)
    if shipped is None:
        return True
    known = shipped["options"]
    return key in known or any(k.startswith(key + ".") for k in known) or any(
        isinstance(known[k].get("default"), dict) for k in _parents(key) if k in known)


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


# -- NeMo RL: a YAML config (and the configs it extends), then Hydra overrides ---------------
def read_nemo_rl(text: str, version: str, source: str,
                 overrides: list[str] | None = None) -> Launch:
    """A NeMo RL config as NeMo RL loads it: OmegaConf's YAML, each ``defaults:`` parent
    loaded first and the child merged over it, then the overrides through Hydra's parser, then
    one resolution. The release's own recipe (its generated surface, interpolations kept as
    written) is the base, so a config whose parents are not on this machine still reads."""
    files = _config_chain(text, source)
    own: dict[str, Any] = {}
    for doc in files:
        own.update(flatten(doc))
    if not any(k.split(".", 1)[0] in ("grpo", "policy", "loss_fn") for k in own):
        raise InvalidInput(f"{source}: not a NeMo RL config (no grpo, policy or loss_fn "
                           "section)")
    launch = Launch("nemo-rl", version, {}, {})
    if len(files) > 1:
        launch.notes.append(f"defaults: {len(files) - 1} parent config(s) merged under "
                            f"{Path(source).name}, as NeMo RL merges them")
    # a config file merges (new keys are added); only command-line overrides are checked
    base = _base_words(version)
    words = [*base,
             *(f"{'' if has_key('nemo-rl', version, k) else '+'}{k}={_hydra_value(v)}"
               for k, v in own.items())]
    given = [*own, *(w.split("=", 1)[0].lstrip("+~") for w in overrides or [])]
    full = read_hydra("nemo-rl", [*words, *(overrides or [])], version, _nemo_reader,
                      trusted=len(base))
    launch.refused = {w: r for w, r in full.refused.items() if w in (overrides or [])}
    launch.settings = {k: v for k, v in full.settings.items()
                       if any(k == g or k.startswith(g + ".") for g in given)}
    for key in launch.settings:
        word = next((w for w in overrides or [] if w.split("=", 1)[0].lstrip("+") == key),
                    None)
        launch.words[key] = word or f"{key}: {own.get(key, full.settings[key])!r}"
    return launch


def nemo_rl_effective(version: str, argv: list[str]) -> dict[str, Any]:
    """What NeMo RL reads from a launch of the hub's: the release's recipe under its
    overrides, resolved once (an interpolated default follows the key it names)."""
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    return _nemo_reader(_plan_like([*_base_words(version), *overrides], version))


def _nemo_reader(plan: Any) -> dict[str, Any]:
    _nemo_resolvers()
    return readers.nemo_rl(plan)


def _nemo_resolvers() -> None:
    """The resolvers NeMo RL registers before it loads a config (``mul``, ``div``, ``max``
    in its recipes), so the recipes resolve here as they do there."""
    from omegaconf import OmegaConf

    for name, function in (("mul", lambda a, b: a * b), ("div", lambda a, b: a / b),
                           ("max", lambda a, b: max(a, b))):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def _base_words(version: str) -> list[str]:
    shipped = surface("nemo-rl", version)
    if shipped is None:
        raise Unsupported(f"no NeMo RL {version} configuration is known to read the config "
                          "against")
    return [f"{k}={_hydra_value(o.get('written', o.get('default')))}"
            for k, o in shipped["options"].items()]


def _config_chain(text: str, source: str) -> list[dict[str, Any]]:
    """The config and the parents it names under ``defaults:``, parents first."""
    from omegaconf import OmegaConf

    chain: list[dict[str, Any]] = []
    here: Path | None = Path(source).resolve().parent
    body: str | None = text
    seen: set[Path] = set()
    while body is not None:
        try:
            cfg = OmegaConf.create(body)
        except Exception as exc:  # yaml.YAMLError and OmegaConf's own, for one file
            raise InvalidInput(f"{source}: not YAML ({str(exc).splitlines()[0]})") from None
        doc = OmegaConf.to_container(cfg, resolve=False)
        if not isinstance(doc, dict):
            raise InvalidInput(f"{source}: not a NeMo RL config (a YAML mapping)")
        parent = doc.pop("defaults", None)
        chain.insert(0, {str(k): v for k, v in doc.items()})
        body = None
        if isinstance(parent, str) and here is not None:
            path = (here / parent).resolve()
            if path in seen or not path.is_file():
                break
            seen.add(path)
            body, here = path.read_text(encoding="utf-8"), path.parent
    return chain


def _hydra_value(v: Any) -> str:
    """A config value as a Hydra override value that reads back as the config wrote it,
    interpolations included (they are the config's own, resolved as NeMo RL resolves them)."""
    from stateset_backend.translate.overrides import quoted

    if isinstance(v, str):
        return quoted(v)
    if isinstance(v, list):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


# -- TRL: a GRPOConfig file, as `trl grpo --config` reads it ---------------------------------
# TRL's command line parses one YAML file into its GRPOConfig and the script's own model and
# dataset arguments (HfArgumentParser). The script's arguments the hub's launch carries under
# its own names: the model and a local data file.
TRL_SCRIPT_KEYS = {"model_name_or_path": "launch.model", "dataset_name": "launch.train_uri",
                   "model_revision": None, "dtype": None, "torch_dtype": None,
                   "attn_implementation": None, "dataset_config": None,
                   "dataset_train_split": None, "dataset_test_split": None,
                   "dataset_streaming": None, "reward_funcs": None,
                   "reward_model_name_or_path": None, "use_peft": None, "lora_r": None,
                   "lora_alpha": None, "lora_dropout": None, "lora_target_modules": None}


def read_trl(text: str, version: str, source: str, fields: set[str]) -> Launch:
    """The file's YAML (JSON is YAML too) as HfArgumentParser reads it: every key a field of
    GRPOConfig or of the script's own arguments, anything else refused as TRL refuses it."""
    try:
        import yaml
    except ImportError:
        raise Unsupported("reading a TRL config needs pyyaml (pip install pyyaml), as TRL "
                          "does") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not YAML or JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{source}: not a TRL config (a mapping of GRPOConfig fields)")
    unknown = sorted(str(k) for k in doc if k not in fields and k not in TRL_SCRIPT_KEYS)
    if unknown:
        raise InvalidInput(f"{source}: TRL {version}'s GRPOConfig and script arguments have no "
                           f"{', '.join(map(repr, unknown[:5]))} (HfArgumentParser refuses "
                           "unused keys)")
    launch = Launch("trl", version, {}, {})
    for key, value in doc.items():
        target = TRL_SCRIPT_KEYS.get(key, key) if key in TRL_SCRIPT_KEYS else key
        if target is None:
            launch.refused[f"{key}: {value!r}"] = (
                "a TRL script argument the hub's launch sets from the spec or does not use "
                "(the reward comes from reward.entrypoint, the dtype from model.dtype)")
            continue
        launch.settings[target] = value
        launch.words[target] = f"{key}: {value!r}"
    return launch


READERS: dict[str, Callable[[str, str, str], Launch]] = {
    "verl": read_verl, "openrlhf": read_openrlhf, "nemo-rl": read_nemo_rl}

# The function name an engine calls in a reward file when the launch names none.
REWARD_FUNCTION = {"verl": "compute_score", "openrlhf": "reward_func"}


def read_file(engine: str, path: Path, version: str, overrides: list[str] | None = None,
              fields: set[str] | None = None) -> Launch:
    reader = READERS.get(engine)
    if reader is None and engine != "trl":
        raise Unsupported(f"import reads verl, OpenRLHF, NeMo RL and TRL launches, not "
                          f"{engine}")
    if overrides and engine != "nemo-rl":
        raise InvalidInput("--override is for a NeMo RL config; a script's overrides are read "
                           "from the script")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: cannot be read ({exc.__class__.__name__})") from None
    if engine == "nemo-rl":
        return read_nemo_rl(text, version, str(path), overrides)
    if engine == "trl":
        return read_trl(text, version, str(path), fields or set())
    assert reader is not None
    return reader(text, version, str(path))
