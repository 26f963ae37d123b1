"""Rehearsal: the engine's own trainer runs a spec for a few updates on this machine's CPUs,
with a shrunk model of the spec's architecture and the spec's own data, reward and settings,
and the hub judges what it left as it judges a run, plus what must hold at the first update and
what a second start from a checkpoint must continue.
What a GPU run would hit, found before a GPU is paid for.

Where it lives: ``<runs dir>/.rehearsals/``, beside the run store and never in it::

    .rehearsals/models/<key>/        a shrunk model, reused by every rehearsal of the same one
    .rehearsals/<run id>/plan.json   the rehearsal's own plan (its own run id and digest)
    .rehearsals/<run id>/attempt/    the engine's run directory
    .rehearsals/<run id>/result.json collect-and-validate's result
    .rehearsals/<run id>/resumed/    the second start, from the checkpoint of update N-1
    .rehearsals/<run id>/resumed.json collect-and-validate's result of it
    .rehearsals/<run id>/verdict.json

A rehearsal is not the experiment: another model and another number of updates make another
experiment digest. Were it a run of the store, `runs list`, `runs compare`, `report` and
`--resume` would offer it as one, and the index would count it; the store and its index pass
over dot-folders (as they pass over ``.quarantined``), and no run id starts with a dot, so
nothing finds it there unasked. It sits beside the store rather than in a temporary folder so
that a failed rehearsal's logs stay where the user keeps runs, `--runs-dir` moves both alike,
and the shrunk models are built once. The spec file is never written: the rehearsal's spec is
made in memory and recorded in its plan.
"""

from stateset_backend.runs.rehearsal.run import REHEARSALS, Verdict, rehearsal_of, rehearse
from stateset_backend.runs.rehearsal.verdict import Line

__all__ = ["REHEARSALS", "Line", "Verdict", "rehearsal_of", "rehearse"]
