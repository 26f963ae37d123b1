"""Proving, before launch, that the files a spec names are the files it pinned.

Engines other than the native one never look at ``sha256``; without this check a changed
data file or reward function would run as "the same experiment". Only local paths are
checked: a URI the engine resolves itself (``s3://``, ``hf://``) is the engine's to fetch.
"""

from __future__ import annotations

import copy
import io
import os
import stat
from pathlib import Path
from typing import Any, Literal

from stateset_backend.common.display import problems_text
from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import MAX_JSON_BYTES
from stateset_backend.common.reading import kind_of, open_regular, read_regular
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.model import ExperimentSpec


def local_paths(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """(field, path) for every string the hub or an engine opens as a local path."""
    paths = [("model.path", spec.model.path)]
    for name in ("train", "validation", "test"):
        split = getattr(spec.data, name)
        if split is not None:
            paths.append((f"data.{name}.uri", split.uri))
    for section in ("reward", "environment"):
        entry = getattr(spec, section).entrypoint
        if entry and ":" in entry and (section == "environment" or spec.reward.kind == "python"):
            paths.append((f"{section}.entrypoint", entry.rpartition(":")[0]))
    return [(f, p.removeprefix("file://")) for f, p in paths
            if "://" not in p or p.startswith("file://")]


BUILTIN_PREFIX = "builtin:"
# the native engine's tiny models ship as config and tokenizer files inside the package
BUILTIN_ASSETS = Path(__file__).resolve().parent.parent / "native" / "assets"


def builtin_model_dir(model_path: str) -> Path | None:
    """The asset folder a ``builtin:<name>`` model path names (None for other paths): what
    every engine that accepts a built-in model loads its config and tokenizer from."""
    if not model_path.startswith(BUILTIN_PREFIX):
        return None
    name = model_path.removeprefix(BUILTIN_PREFIX)
    directory = BUILTIN_ASSETS / name
    if not name or "/" in name or not (directory / "config.json").is_file():
        known = sorted(p.name for p in BUILTIN_ASSETS.iterdir() if p.is_dir()) \
            if BUILTIN_ASSETS.is_dir() else []
        raise InvalidInput(f"model.path: no built-in model {name!r} "
                           f"(built-in: {', '.join(known) or 'none'})")
    return directory


def local_path(uri: str, base_dir: Path) -> Path | None:
    """The file a URI names on this machine, or None for one the engine fetches itself."""
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = Path(uri.removeprefix("file://"))
    return path if path.is_absolute() else base_dir / path


# What the hub reads whole from a file a spec names; anything larger is refused before it is
# read. Files it streams (hashing, counting JSON lines, a parquet footer) have no size limit:
# they are read in blocks, and never past the size they had when opened.
MAX_SOURCE_BYTES = 16 << 20  # a reward or environment module
MAX_WHOLE_SPLIT_BYTES = 1 << 30  # a .json split (one array, parsed whole to count its rows)
# A local model folder is walked to prove each of its files is a regular file; one this large
# is not a model folder (a home directory, a dataset root) and is refused rather than walked.
MAX_MODEL_ENTRIES = 100_000


def probe(field: str, path: Path) -> Literal["file", "dir", "missing"]:
    """What a path a spec names is on this machine. Anything the operating system refuses
    (permission, a symlink loop, a file where a folder should be, a name too long), and
    anything that is neither a regular file nor a folder (a FIFO, a device, a socket, which
    would block or never end when read), is the spec's to fix: one line naming the field,
    never an operating-system traceback or a hang."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except (OSError, RuntimeError) as exc:  # RuntimeError: pathlib's own symlink-loop error
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidInput(f"{field}: cannot use {str(path)!r}: {reason}") from None
    if stat.S_ISDIR(mode):
        return "dir"
    if not stat.S_ISREG(mode):
        raise InvalidInput(f"{field}: {str(path)!r} is {kind_of(mode)}, not a regular file")
    return "file"


def _limit(field: str, path: Path) -> int | None:
    if field.endswith("entrypoint"):
        return MAX_SOURCE_BYTES
    return MAX_WHOLE_SPLIT_BYTES if path.suffix == ".json" else None


def _model_folder_problem(folder: Path) -> str | None:
    """The first entry of a local model folder that an engine could not read as a file."""
    seen = 0
    for parent, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            seen += 1
            if seen > MAX_MODEL_ENTRIES:
                return (f"{str(folder)!r} holds more than {MAX_MODEL_ENTRIES:,} entries, which "
                        "is not a model folder")
            entry = Path(parent, name)
            try:
                mode = entry.stat().st_mode
            except FileNotFoundError:
                continue  # a dangling link: the engine's loader names it if it needs it
            except OSError as exc:
                return f"{str(entry)!r}: {exc.strerror}"
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return f"{str(entry)!r} is {kind_of(mode)}, not a regular file"
    return None


def input_file_problems(spec: ExperimentSpec, base_dir: Path) -> list[str]:
    """Every local file the spec names that is there but could not be read as one: a FIFO,
    device, socket or folder where a file belongs, a file over what the hub reads whole, a
    model folder holding such an entry. A missing file is not a problem here (it may be made
    later, or fetched where the engine runs); reading it is, and is refused then."""
    problems = []
    for field, text in local_paths(spec):
        path = Path(text) if Path(text).is_absolute() else base_dir / text
        try:
            kind = probe(field, path)
        except InvalidInput as exc:
            problems.append(exc.message)
            continue
        if kind == "dir":
            if field == "model.path":
                problem = _model_folder_problem(path)
                if problem is not None:
                    problems.append(f"{field}: {problem}")
            else:
                problems.append(f"{field}: {str(path)!r} is a directory, not a file")
        elif kind == "file":
            limit = _limit(field, path)
            size = path.stat().st_size
            if limit is not None and size > limit:
                problems.append(f"{field}: {str(path)!r} is {size:,} bytes, over the "
                                f"{limit:,} bytes the hub reads of such a file")
    return problems


def check_input_files(spec: ExperimentSpec, base_dir: Path) -> None:
    """``input_file_problems`` as one refusal (exit 2) listing each."""
    problems = input_file_problems(spec, base_dir)
    if problems:
        raise InvalidInput(f"{len(problems)} problem(s) with the files the spec names: "
                           + problems_text(problems), details={"problems": problems})


def resolved(field: str, path: Path) -> Path:
    """``path`` made absolute with its links followed; a loop is the spec's to fix."""
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidInput(f"{field}: cannot use {str(path)!r}: {reason}") from None


def _rebased(value: str, source: Path, target: Path) -> str:
    """``value`` (a local path, relative to ``source``) relative to ``target`` instead."""
    if "://" in value or Path(value).is_absolute() or value.startswith("~"):
        return value  # a URI the engine fetches, or a path that means the same anywhere
    return os.path.relpath(source / value, target)


def rebase_spec_paths(doc: dict[str, Any], source: Path, target: Path) -> dict[str, Any]:
    """A spec document moved from folder ``source`` to folder ``target``, its relative data
    paths and reward/environment files still naming the same files (a relative path is read
    from the spec's own folder). ``model.path`` stays as written: it must match the run a
    ``from_run`` names, and "org/name" is a hub id, not a path."""
    out = copy.deepcopy(doc)
    data = out.get("data")
    for name in ("train", "validation", "test"):
        split = data.get(name) if isinstance(data, dict) else None
        if isinstance(split, dict) and isinstance(split.get("uri"), str):
            uri = split["uri"]
            scheme = "file://" if uri.startswith("file://") else ""
            split["uri"] = scheme + _rebased(uri.removeprefix("file://"), source, target)
    for section in ("reward", "environment"):
        part = out.get(section)
        if not isinstance(part, dict) or (section == "reward" and
                                          part.get("kind", "python") != "python"):
            continue  # only a python reward names a file; a remote one names a service
        entry = part.get("entrypoint")
        if isinstance(entry, str) and ":" in entry:
            file_part, _, function = entry.rpartition(":")
            part["entrypoint"] = f"{_rebased(file_part, source, target)}:{function}"
    return out


class _Bounded(io.RawIOBase):
    """A file read no further than ``size`` bytes: a split that grows while it is counted is
    counted as it was when opened."""

    def __init__(self, file: Any, size: int) -> None:
        self._file, self._left = file, size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(min(len(buffer), self._left))
        buffer[:len(data)] = data
        self._left -= len(data)
        return len(data)


class Uncountable(ValueError):
    """A split whose rows cannot be counted on this machine; the message says why."""


def split_rows(uri: str, base_dir: Path, field: str = "data.train.uri") -> int:
    """Rows of a local split: non-empty lines of JSON lines, elements of a JSON array, or a
    parquet file's row count from its footer (pyarrow, imported only here). Engines that size
    their passes or validation batches from the data need it at plan time."""
    path = local_path(uri, base_dir)
    if path is None:
        raise Uncountable(f"{uri} is not a local file")
    if probe(field, path) != "file":
        raise Uncountable(f"{path}: no such file")
    try:
        if path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise Uncountable(f"{path}: counting a parquet file's rows needs pyarrow "
                                  "(pip install pyarrow)") from None
            return int(pq.ParquetFile(path).metadata.num_rows)
        if path.suffix == ".json":
            import json

            doc = json.loads(read_regular(path, MAX_WHOLE_SPLIT_BYTES).decode("utf-8"))
            if not isinstance(doc, list):
                raise Uncountable(f"{path}: a JSON split is an array of rows")
            return len(doc)
        if path.suffix == ".jsonl":
            with open_regular(path) as (file, size):
                lines = io.BufferedReader(_Bounded(file, size))
                return sum(1 for line in lines if line.strip())
    except Uncountable:
        raise
    except Exception as exc:  # pyarrow and json raise their own types for a damaged file
        raise Uncountable(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    raise Uncountable(f"{path}: only .jsonl, .json and .parquet splits can be counted")


def check_chat_template(spec: ExperimentSpec, base_dir: Path) -> None:
    """``data.chat_template`` on a local model folder whose tokenizer has no chat template:
    engines then fail on the first prompt they render (verl drops every row and dies on an
    empty sampler) or fall back to a template of their own, so it is refused before launch.
    A hub id or remote model is left to the engine, which holds its files."""
    if not spec.data.chat_template:
        return
    folder = local_path(spec.model.path, base_dir)
    if folder is None or not (folder / "tokenizer_config.json").is_file() or \
            (folder / "chat_template.jinja").is_file() or \
            (folder / "chat_template.json").is_file():
        return
    config = folder / "tokenizer_config.json"
    try:
        import json

        template = json.loads(read_regular(config, MAX_JSON_BYTES)).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return  # an unreadable tokenizer config is the engine's to report, with its loader
    if not template:
        raise InvalidInput(f"data.chat_template is true, but the tokenizer in {str(folder)!r} "
                           "has no chat template: add one to its tokenizer_config.json (or a "
                           "chat_template.jinja), or set data.chat_template to false to give "
                           "the engine the prompts as they are")


def check_budget_fits(spec: ExperimentSpec, base_dir: Path) -> None:
    """A train split smaller than one update can never run a single update: invalid input at
    plan time, not a failure after launch. A split that cannot be counted here (remote, not
    yet fetched) is left to the engine."""
    try:
        rows = split_rows(spec.data.train.uri, base_dir)
    except Uncountable:
        return
    if rows < spec.budget.prompts_per_update:
        raise InvalidInput(f"data.train: {rows} rows, fewer than one update's "
                           f"{spec.budget.prompts_per_update} prompts "
                           "(budget.prompts_per_update)")


REWARD_SHIM_FILE = "stateset_reward.py"

# Where a rehearsal watches the engine: with this variable set, every call the engine makes to
# the spec's reward appends one JSON line (prompt, response, answer, score, pid) to the file it
# names. The hub writes the shim, so the engine cannot describe these calls otherwise than it
# makes them. One source for the shim and the native engine, which runs it in process.
REWARD_CALLS_ENV = "STATESET_REWARD_CALLS"
REWARD_CALLS_SOURCE = '''
import json as _json
import os as _os

_CALLS_ENV = "STATESET_REWARD_CALLS"


def _recorded(function):
    """``function`` with each call appended to the file $STATESET_REWARD_CALLS names: one
    write of one line in append mode, so processes scoring at once never interleave a line."""
    def recorded(prompt, response, answer):
        value = function(prompt, response, answer)
        line = _json.dumps({"prompt": str(prompt), "response": str(response),
                            "answer": str(answer), "score": repr(value),
                            "pid": _os.getpid()}) + "\\n"
        fd = _os.open(_os.environ[_CALLS_ENV], _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT, 0o600)
        try:
            _os.write(fd, line.encode("utf-8"))
        finally:
            _os.close(fd)
        return value

    return recorded
'''

_REWARD_LOADER = '''"""Generated by stateset-backend: {engine}'s reward call -> the spec's reward.

The reward file is read once, checked against its pinned sha256 in the process that scores
(which may be a worker on another node), and the checked bytes are what runs.
"""
import hashlib
import types

_PATH, _FUNCTION, _SHA256 = {path}, {function}, {sha256}
with open(_PATH, "rb") as _file:
    _source = _file.read()
if _SHA256 is not None and hashlib.sha256(_source).hexdigest() != _SHA256:
    raise RuntimeError(f"reward file {{_PATH}} no longer has the pinned sha256 {{_SHA256}}")
_module = types.ModuleType("stateset_user_reward")
_module.__file__ = _PATH
exec(compile(_source, _PATH, "exec"), _module.__dict__)
score = getattr(_module, _FUNCTION)
''' + REWARD_CALLS_SOURCE.replace("{", "{{").replace("}", "}}") + '''
if _os.environ.get(_CALLS_ENV):
    score = _recorded(score)
'''


def reward_function(spec: ExperimentSpec, base_dir: str | None) -> tuple[str, str]:
    """(absolute file path, function name) of a python reward, for engines that import it."""
    if spec.reward.entrypoint is None:
        raise InvalidInput("reward.entrypoint: this launch imports a python reward function")
    file_part, _, function = spec.reward.entrypoint.rpartition(":")
    path = Path(file_part)
    return str(path if path.is_absolute() else Path(base_dir or ".") / path), function


def reward_shim(spec: ExperimentSpec, base_dir: str | None, engine: str,
                calling_convention: str = "") -> str:
    """The module an engine imports in place of the spec's reward: it exposes
    ``score(prompt, response, answer)`` and, after it, ``calling_convention``, the code that
    adapts the engine's own reward signature to ``score``."""
    path, function = reward_function(spec, base_dir)
    loader = _REWARD_LOADER.format(engine=engine, path=repr(path), function=repr(function),
                                   sha256=repr(spec.reward.sha256))
    return loader + calling_convention


def pinned_files(spec: ExperimentSpec, base_dir: Path) -> list[tuple[str, Path, str]]:
    """(spec field, local path, expected sha256) for every local file the spec pins."""
    pins: list[tuple[str, Path, str]] = []
    for name in ("train", "validation", "test"):
        split = getattr(spec.data, name)
        local = local_path(split.uri, base_dir) if split is not None else None
        if split is not None and local is not None:
            pins.append((f"data.{name}", local, split.sha256))
    reward, environment = spec.reward, spec.environment
    if reward.kind == "python" and reward.entrypoint and reward.sha256 is not None:
        local = local_path(reward.entrypoint.rpartition(":")[0], base_dir)
        if local is not None:
            pins.append(("reward", local, reward.sha256))
    if environment.entrypoint and environment.sha256 is not None:
        local = local_path(environment.entrypoint.rpartition(":")[0], base_dir)
        if local is not None:
            pins.append(("environment", local, environment.sha256))
    return pins


def digest_mismatch(field: str, path: Path, actual: str, expected: str | None) -> str:
    """Both ways a pinned digest stops matching, where the two digests part, and the one edit
    that accepts the file as it is now."""
    expected = expected or ""
    common = next((i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b),
                  min(len(actual), len(expected)))
    key = "reward.sha256" if field == "reward" else "environment.sha256" \
        if field == "environment" else f"{field}.sha256"
    return (f"{field}: {path} has sha256 {actual[:common]}[{actual[common:common + 8]}...], the "
            f"spec pins {expected[:common]}[{expected[common:common + 8]}...] (they differ "
            f"from hex digit {common + 1}): either the file changed since the spec was written "
            "(then this is a different experiment: restore the file) or the spec's digest is "
            f'wrong; to accept the file as it is now, set {key} to "{actual}"')


def verify_inputs(spec: ExperimentSpec, base_dir: Path) -> None:
    """Exit 2 naming the first local file that is missing or has changed, after every file
    the spec names is proven readable as a file."""
    check_input_files(spec, base_dir)
    for field, path, expected in pinned_files(spec, base_dir):
        kind = probe(field, path)
        if kind != "file":
            raise InvalidInput(f"{field}: {str(path)!r} " + (
                "is a directory, not a file" if kind == "dir" else
                "does not exist on this machine"))
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise InvalidInput(f"{field}: cannot read {str(path)!r}: {exc.strerror}") from None
        if actual != expected:
            raise InvalidInput(digest_mismatch(field, path, actual, expected))
