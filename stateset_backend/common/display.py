"""How numbers and terminal output read to a person: a metric never shows as ``+0.0000`` when
it is 3e-6, a log file never holds the escape codes that drew a live bar, and a user's
million-character value never becomes a 20 MB table or error line."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from typing import IO, Any


def metric_text(value: float, signed: bool = False) -> str:
    """Four decimals where they carry the value, three significant digits in scientific
    notation where they would round it to zero (or past 10^5); NaN and infinities by name."""
    if not math.isfinite(value):
        return str(value)
    sign = "+" if signed else ""
    if value == 0:
        return "+0" if signed else "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:{sign}.4f}"
    return f"{value:{sign}.2e}"


# a line ending, a carriage return, or a terminal control sequence (CSI, OSC, a charset switch)
_TOKENS = re.compile(rb"(\n|\r|\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Za-z0-9])")


class PlainLog:
    """Writes a terminal stream to a log file as the lines a reader would see: escape codes
    dropped, and a line that was redrawn in place (a carriage return, an erase-line or
    cursor-up code) kept only as last drawn before its newline, so a live progress bar leaves
    its final state, not one frame per refresh."""

    def __init__(self, sink: IO[bytes]) -> None:
        self.sink, self.line = sink, b""

    def write(self, chunk: bytes) -> None:
        out = []
        for part in _TOKENS.split(chunk):
            if part == b"\n":
                out.append(self.line + b"\n")
                self.line = b""
            elif part == b"\r" or (part.startswith(b"\x1b[") and part[-1:] in b"KA"):
                self.line = b""  # the line is being drawn again
            elif not part.startswith(b"\x1b"):
                self.line += part
        if out:
            self.sink.write(b"".join(out))

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        if self.line:
            self.sink.write(self.line + b"\n")
            self.line = b""
        self.sink.flush()


# How much of a user's text a table or an error line shows (README, under "Commands"); --json
# always carries all of it. A value is something the user typed (a revision, a key, a path);
# a line is prose that may hold one anywhere (a problem, a reason, a note).
VALUE_CHARS = 200  # a longer value shows its first VALUE_HEAD characters, length and digest
VALUE_HEAD = 60
LINE_CHARS = 500  # a longer line keeps its start and its end around the length and digest
PROBLEMS_SHOWN = 10  # an error lists this many problems, then "and N more"
ERROR_CHARS = 8000  # an error line as a whole, whoever built it


def _digest(text: str) -> str:
    # a lone surrogate cannot be UTF-8, and the text it is in is still worth telling apart
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def elided(value: str, limit: int = VALUE_CHARS) -> str:
    """A user's value as a person reads it: whole while short; past ``limit`` its start, its
    length and a digest, which still tell two long values apart and match one against the
    file it came from."""
    if len(value) <= limit:
        return value
    return (f"'{value[:VALUE_HEAD]}…' ({len(value):,} characters, "
            f"sha256:{_digest(value)}…)")


def elided_json(value: Any, limit: int = VALUE_CHARS) -> str:
    """A JSON value as a table cell: its JSON text while short, else elided; a long string's
    digest is the string's own, the one a user can compute from the spec."""
    if isinstance(value, str) and len(value) > limit:
        return elided(value, limit)
    text = json.dumps(value)
    return elided(text, limit)


def elided_line(line: str, limit: int = LINE_CHARS) -> str:
    """Prose that may hold a user's text anywhere (a problem's path, a reason quoting a
    value): the start says where, the end usually says what is wrong, so both stay and the
    middle gives way to how much was left out and the whole line's digest."""
    if len(line) <= limit:
        return line
    head, tail = limit * 3 // 5, limit // 5
    return (f"{line[:head]}…[{len(line) - head - tail:,} of {len(line):,} characters left "
            f"out, sha256:{_digest(line)}…]…{line[-tail:]}")


def problems_text(problems: Sequence[str], shown: int = PROBLEMS_SHOWN) -> str:
    """Problems as one error line: each bounded, the first ``shown`` of them, then how many
    more; the full list belongs in the error's details, which ``--json`` prints."""
    text = "; ".join(elided_line(p) for p in problems[:shown])
    more = len(problems) - shown
    return text + (f"; and {more:,} more (--json lists every one)" if more > 0 else "")
