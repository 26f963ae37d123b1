"""The kit's checks as plain functions: the pytest classes and the compatibility matrix call
the same code, so what the matrix shows is what the suite proves.

Each check raises :class:`CheckFailed` with the reason, or returns what it found. The modules
follow a sample through the pipeline, each holding the checks that prove one thing:

- ``planning``: the samples plan; a claimed capability plans with nothing dropped, an
  unclaimed one is refused; the gaps an adapter declares;
- ``determinism``: a plan depends on its spec and release alone;
- ``interpreters``: nor on the interpreter that made it (its hash seed);
- ``injection``: user strings are data; ``engine_options`` cannot reach a key the launch sets;
- ``engine_reads``: the launch as the engine reads it, held to the launch, the release and
  the spec; each setting reaches exactly the keys it claims;
- ``outputs``: collecting the engine's outputs, and resuming from a checkpoint.

Every check and constant is importable from here, as from the module that holds it.
"""

from __future__ import annotations

from stateset_backend.conformance.checks.determinism import (
    check_deterministic_and_pure,
    check_launchers_compile,
    normalized,
)
from stateset_backend.conformance.checks.distinct import (
    DISTINCT_LEAVES,
    OBJECTIVE_CLASSES,
    check_distinct_launches,
)
from stateset_backend.conformance.checks.engine_reads import (
    check_deviations_run,
    check_expected,
    check_reads_as_declared,
    check_sensitivity,
    normalize_values,
    own_leaves,
    same_value,
)
from stateset_backend.conformance.checks.injection import (
    BENIGN,
    HOSTILE,
    PROBE_SECRET,
    STRING_FIELDS,
    benign_refused,
    check_argv_structure,
    check_no_free_text_option,
    check_read_back,
    hostile_doc,
    rotations,
)
from stateset_backend.conformance.checks.interpreters import check_plans_agree_across_processes
from stateset_backend.conformance.checks.options import (
    check_namespace_keys,
    check_option_aliases,
    check_option_keys,
    owned_keys,
    spellings,
)
from stateset_backend.conformance.checks.outputs import (
    COLLECTION_CASES,
    HEALTHY,
    Case,
    Writer,
    check_collection,
)
from stateset_backend.conformance.checks.planning import (
    CheckFailed,
    awkward_plans,
    base_plan,
    check_capability,
    check_no_silent_drop,
    check_range_edges,
    claimed_plans,
    declared_unsupported,
    fitted_base,
    plan_doc,
    plannable_sample,
    reasons_of,
)
from stateset_backend.conformance.checks.resume import UPDATES as RESUME_UPDATES
from stateset_backend.conformance.checks.resume import check_resume, critic_plan

__all__ = [
    "BENIGN",
    "COLLECTION_CASES",
    "DISTINCT_LEAVES",
    "HEALTHY",
    "HOSTILE",
    "OBJECTIVE_CLASSES",
    "PROBE_SECRET",
    "RESUME_UPDATES",
    "STRING_FIELDS",
    "Case",
    "CheckFailed",
    "Writer",
    "awkward_plans",
    "base_plan",
    "benign_refused",
    "check_argv_structure",
    "check_capability",
    "check_collection",
    "check_deterministic_and_pure",
    "check_deviations_run",
    "check_distinct_launches",
    "check_expected",
    "check_launchers_compile",
    "check_namespace_keys",
    "check_no_free_text_option",
    "check_no_silent_drop",
    "check_option_aliases",
    "check_option_keys",
    "check_plans_agree_across_processes",
    "check_range_edges",
    "check_read_back",
    "check_reads_as_declared",
    "check_resume",
    "check_sensitivity",
    "claimed_plans",
    "critic_plan",
    "declared_unsupported",
    "fitted_base",
    "hostile_doc",
    "normalize_values",
    "normalized",
    "own_leaves",
    "owned_keys",
    "plan_doc",
    "plannable_sample",
    "reasons_of",
    "rotations",
    "same_value",
    "spellings",
]
