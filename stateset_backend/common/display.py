"""How numbers and terminal output read to a person: a metric never shows as ``+0.0000`` when
it is 3e-6, and a log file never holds the escape codes that drew a live bar."""

from __future__ import annotations

import math
import re
from typing import IO


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
