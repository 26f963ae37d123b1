"""The native engine's execution options: what ``engine_options.native`` may set.

Each one changes how an update is computed, not the experiment: it lives outside the
experiment's identity (the plan's binding digest records it, and so does the run's
``run_info.json``). The release's contract declares each with its reason and values
(``keys.execution`` in ``contracts/native.json``); this module is the engine's side, the one
rule the adapter applies at plan time and the trainer again at start: the defaults the launch
writes and what the engine can honour. What the spec cannot show (a model architecture the
fast decoder does not cover) the trainer checks once the model is loaded. Torch-free, because
the adapter renders the launch without importing the engine.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.spec.model import SUPERVISED, ExperimentSpec

# sampling.kernels: "exact" samples bit for bit as every earlier run of the engine did;
# "fast" decodes over a static cache, only the rows still generating, in fewer and larger
# products: the same arithmetic rounded in another order, so the recorded sampling log-probs
# carry its rounding and a seed's trajectories can part from the exact path's
KERNELS = ("exact", "fast")
DEFAULTS: dict[str, Any] = {"sampling.kernels": "exact"}
ACCEPTED: dict[str, tuple[Any, ...]] = {"sampling.kernels": KERNELS}


def problems(options: dict[str, Any], spec: ExperimentSpec | None = None) -> list[str]:
    """What the engine cannot honour in a launch's execution options, each as ``key: why``
    (none when all is well): a key it does not read, a value it does not implement, or a
    kernel choice the run would never use, so that it is refused instead of ignored."""
    out = []
    for key, value in options.items():
        if key not in ACCEPTED:
            out.append(f"{key}: the native engine reads its settings from the spec; its "
                       "execution options are " + ", ".join(
                           f"{k} ({' | '.join(map(str, v))})" for k, v in ACCEPTED.items()))
        elif value not in ACCEPTED[key] or isinstance(value, bool):
            out.append(f"{key}: {value!r} is not one of {', '.join(map(repr, ACCEPTED[key]))}")
    if out or spec is None or options.get("sampling.kernels", "exact") == "exact":
        return out
    key = "sampling.kernels: 'fast'"
    if spec.environment.kind != "single_turn":
        out.append(f"{key}: a conversation samples each turn with the exact kernels only")
    elif spec.algorithm.objective == SUPERVISED and spec.evaluation.every is None:
        out.append(f"{key}: an sft run without validation samples nothing")
    elif spec.model.lora is not None:
        out.append(f"{key}: a LoRA model samples through its own forward, which has only the "
                   "exact kernels")
    return out
