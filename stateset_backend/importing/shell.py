"""A launch script read as the shell would split it, without running any of it.

Teams keep their launches as shell scripts: assignments at the top, one long engine command
with its settings as words, sometimes ``$(...)`` or the script's own arguments (``"$@"``). The
import must see the same words the engine's parser would get, so the script is split by
``shlex`` (POSIX rules: quotes, escapes) into commands, the script's own literal assignments
are substituted where the shell would substitute them, and everything the shell would only
know when it runs (the caller's environment, ``$(...)``, positional arguments) is kept
verbatim and reported, never executed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from stateset_backend.common.errors import InvalidInput

_SHELL_WORDS = frozenset({"set", "export", "unset", "cd", "echo", "source", ".", "exec",
                          "nohup", "env", "time", "mkdir", "rm"})


@dataclass
class Script:
    """The commands of a script, each a list of words, and what the shell alone would know."""

    commands: list[list[str]]
    assignments: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)  # NAME=( words ... )
    unresolved: list[str] = field(default_factory=list)  # one line per unknown expansion
    substituted: list[str] = field(default_factory=list)  # one line per script variable used


def _is_name(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and \
        all(c.isalnum() or c == "_" for c in text)


def _assignment(word: str) -> tuple[str, str] | None:
    name, eq, value = word.partition("=")
    return (name, value) if eq and _is_name(name) else None


class _Expander:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` from the script's own assignments;
    anything else is left as written and reported once."""

    def __init__(self, script: Script) -> None:
        self.script = script

    def _note(self, line: str) -> None:
        if line not in self.script.unresolved:
            self.script.unresolved.append(line)

    def _lookup(self, name: str, default: str | None) -> str | None:
        known = self.script.assignments
        if name in known:
            used = f"${name} = {known[name]!r} (the script's own assignment)"
            if used not in self.script.substituted:
                self.script.substituted.append(used)
            return known[name]
        if default is not None:
            used = f"${name} is not set in the script: its default {default!r} is used"
            if used not in self.script.substituted:
                self.script.substituted.append(used)
            return default
        if name == "HOME":  # kept as written; a data or reward path under it reads as ~
            self._note("$HOME: the launching user's home; a file path under it is read as ~ "
                       "(this user's home)")
            return None
        self._note(f"${name}: set outside the script (the caller's environment or a file it "
                   "sources), so its value is not known here")
        return None

    def word(self, text: str) -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            char = text[i]
            if char != "$" or i + 1 >= len(text):
                out.append(char)
                i += 1
                continue
            nxt = text[i + 1]
            if nxt == "{":
                end = text.find("}", i + 2)
                inner = text[i + 2:end] if end > 0 else ""
                name, sep, default = inner.partition(":-")
                if end > 0 and _is_name(name):
                    value = self._lookup(name, default if sep else None)
                    out.append(text[i:end + 1] if value is None else value)
                    i = end + 1
                    continue
                out.append(char)  # ${a.b} and the like: Hydra's interpolation, not the shell's
                i += 1
                continue
            j = i + 1
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            name = text[i + 1:j]
            if _is_name(name):
                value = self._lookup(name, None)
                out.append(text[i:j] if value is None else value)
                i = j
                continue
            if nxt in "@*#0123456789":
                self._note(f"${nxt}: the script's own arguments, known only when it runs")
                out.append(text[i:i + 2])
                i += 2
                continue
            out.append(char)
            i += 1
        return "".join(out)


def _without_comments(text: str) -> str:
    """The script without its comments: a ``#`` that starts a word, outside quotes, to the end
    of its line. Taken out before splitting, so a quote inside a comment (``# it's``) opens
    nothing, while ``$#``, ``${X#y}`` and a quoted ``#`` stay."""
    out: list[str] = []
    quote: str | None = None
    start = True  # at the start of a word
    i = 0
    while i < len(text):
        char = text[i]
        if quote is not None:
            if char == "\\" and quote == '"' and i + 1 < len(text):
                out.append(text[i:i + 2])
                i += 2
                continue
            quote = None if char == quote else quote
        elif char == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i, start = i + 2, False
            continue
        elif char in "'\"":
            quote, start = char, False
        elif char == "#" and start:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        else:
            start = char in " \t\r\n;&|()"
        out.append(char)
        i += 1
    return "".join(out)


def _tokens(text: str) -> list[str]:
    """The script's words and separators. A backslash-newline joins lines as the shell does,
    a word opening with ``#`` starts a comment, and ``$(`` ... ``)`` comes back as one word
    (its nesting kept), which the caller reports instead of running."""
    lexer = shlex.shlex(_without_comments(text).replace("\\\r\n", " ").replace("\\\n", " "),
                        posix=True, punctuation_chars=";&|()\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    raw: list[str] = []
    try:
        tokens = list(lexer)
    except ValueError as exc:  # an unclosed quote: the shell would refuse the script too
        raise InvalidInput(f"the script cannot be split as the shell splits it ({exc})") \
            from None
    for token in tokens:  # shlex joins neighbouring punctuation ("(\n", ");"): split it
        if token and all(c in ";&|\n()" for c in token):
            for char in token:
                if char in "()":
                    raw.append(char)
                elif not raw or raw[-1] != "\n":
                    raw.append("\n")
        else:
            raw.append(token)
    out: list[str] = []
    i = 0
    while i < len(raw):
        token = raw[i]
        if token.startswith("#"):  # a comment, to the end of its line
            while i < len(raw) and "\n" not in raw[i]:
                i += 1
            continue
        if token.endswith("$") and i + 1 < len(raw) and raw[i + 1].startswith("("):
            depth, j, inner = 0, i + 1, []
            while j < len(raw):
                depth += raw[j].count("(") - raw[j].count(")")
                inner.append(raw[j])
                j += 1
                if depth <= 0:
                    break
            out.append(token + "(" + " ".join(inner[1:-1]) + ")")
            i = j
            continue
        out.append("\n" if _separator(token) else token)
        i += 1
    return out


def _separator(token: str) -> bool:
    """shlex joins neighbouring punctuation (``;\n``, blank lines) into one token."""
    return bool(token) and all(c in ";&|\n" for c in token)


def read_script(text: str) -> Script:
    """The script's commands, its assignments applied to later words as the shell would."""
    script = Script(commands=[])
    expand = _Expander(script)
    current: list[str] = []
    tokens = [*_tokens(text), "\n"]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        pair = _assignment(token)
        if pair is not None and not pair[1] and i < len(tokens) and tokens[i] == "(":
            # NAME=( words ... ): an array, its words split and expanded as the shell does
            words: list[str] = []
            i += 1
            while i < len(tokens) and tokens[i] != ")":
                if not _separator(tokens[i]):
                    words.append(expand.word(tokens[i]))
                i += 1
            script.arrays[pair[0]] = words
            i += 1
            continue
        if _separator(token):
            if current:
                _finish(script, current, expand)
            current = []
            continue
        current.append(token)
    return script


def _finish(script: Script, words: list[str], expand: _Expander) -> None:
    """One command: leading ``NAME=value`` words with nothing after them set script
    variables (``export`` too); a command keeps its words, each expanded."""
    body = words[1:] if words[0] in ("export", "readonly", "local", "declare") else words
    if body and all(_assignment(w) is not None for w in body):
        for w in body:
            pair = _assignment(w)
            assert pair is not None
            name, value = pair
            if "$(" in value or "`" in value:
                script.unresolved.append(f"${name} = {value}: a command substitution, not run "
                                         "by the import")
                continue
            script.assignments[name] = expand.word(value)
        return
    expanded: list[str] = []
    for w in words:
        array = w[2:-4] if w.startswith("${") and w.endswith("[@]}") else None
        if array is not None and array in script.arrays:  # "${NAME[@]}": the array's words
            expanded.extend(script.arrays[array])
        else:
            expanded.append(expand.word(w))
    for w in expanded:
        if "$(" in w or "`" in w:
            note = f"{w}: a command substitution, not run by the import"
            if note not in script.unresolved:
                script.unresolved.append(note)
    script.commands.append(expanded)


def command_of(script: Script, is_engine: object) -> tuple[list[str], int] | None:
    """The first command in which a word satisfies ``is_engine`` and the index of the word
    after it (where the engine's own settings start), or None."""
    assert callable(is_engine)
    for words in script.commands:
        for i, word in enumerate(words):
            if is_engine(word):
                return words, i + 1
    return None


def is_shell_builtin(word: str) -> bool:
    return word in _SHELL_WORDS


def looks_like_script(text: str) -> bool:
    """A shell script, as opposed to a file of one override per line: a shebang, or any line
    whose first word is a command rather than ``key=value``."""
    if text.startswith("#!"):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        first = stripped.split(None, 1)[0]
        if "=" not in first or first.startswith(("python", "torchrun", "ray", "deepspeed")):
            return True
    return False
