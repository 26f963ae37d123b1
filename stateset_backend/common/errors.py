"""Error types, each carrying the CLI exit code it maps to, so the mapping lives in one place."""

from __future__ import annotations

from typing import Any


class StatesetError(Exception):
    """Base of every error the CLI reports as one line instead of a traceback."""

    exit_code = 1
    kind = "error"

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": self.kind, "message": self.message,
                               "exit_code": self.exit_code}
        if self.details is not None:
            doc["details"] = self.details
        return doc


class InvalidInput(StatesetError):
    """A spec, plan, contract or argument that cannot be used as given."""

    exit_code = 2
    kind = "invalid_input"


class Unsupported(StatesetError):
    """The engine (version) cannot do what the spec asks; nothing was launched."""

    exit_code = 3
    kind = "unsupported"


class EngineFailed(StatesetError):
    """The engine process exited non-zero or could not be started."""

    exit_code = 4
    kind = "engine_failed"


class InvalidResult(StatesetError):
    """The engine exited 0 but its outputs failed a result check."""

    exit_code = 5
    kind = "invalid_result"


class ResumeImpossible(StatesetError):
    """A resume was asked for but no complete checkpoint of the same experiment exists."""

    exit_code = 6
    kind = "resume_impossible"


class NotExecuted(StatesetError):
    """The attempt was prepared for a cluster (its manifest written into the attempt), not
    executed: nothing ran, so nothing succeeded. Applying it is the next step."""

    exit_code = 7
    kind = "not_executed"


class Interrupted(StatesetError):
    """The user interrupted the run (Ctrl-C / SIGTERM); the process group was killed."""

    exit_code = 130
    kind = "interrupted"


class AdapterBug(Unsupported):
    """An adapter broke the rule kit's contract (a leaf with no rule or no state, two rules
    setting one key differently, an engine default left unpinned). Nothing launches, and the
    message names the adapter, so the user knows whom to tell."""

    kind = "adapter_bug"
