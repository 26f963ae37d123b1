"""The native engine's execution options: what ``engine_options.native`` may set.

Each one changes how an update is computed, never what it computes, so it lives outside the
experiment's identity (the plan's binding digest records it, and the run's record names it).
The release's contract declares each with its reason and values (``keys.execution`` in
``contracts/native.json``); this module is the engine's side: the defaults the launch writes
and the values the trainer accepts. Torch-free, because the adapter renders the launch
without importing the engine.
"""

from __future__ import annotations

from typing import Any

# sampling.kernels: "exact" samples bit for bit as every earlier run of the engine did;
# "fast" batches each decode step's attention into fewer, larger products, whose rounding
# differs in the last bits, so a seed's trajectories can part from the exact path's
KERNELS = ("exact", "fast")
DEFAULTS: dict[str, Any] = {"sampling.kernels": "exact"}
ACCEPTED: dict[str, tuple[Any, ...]] = {"sampling.kernels": KERNELS}


def problems(options: dict[str, Any]) -> list[str]:
    """What the trainer cannot honour in a launch's execution options (none when all is
    well): a key it does not read, or a value it does not implement."""
    out = []
    for key, value in options.items():
        if key not in ACCEPTED:
            out.append(f"{key}: the native engine reads no such execution option (it reads "
                       f"{', '.join(sorted(ACCEPTED))})")
        elif value not in ACCEPTED[key] or isinstance(value, bool):
            out.append(f"{key}: {value!r} is not one of {', '.join(map(repr, ACCEPTED[key]))}")
    return out
