"""Pinned model revisions for engines that have no revision setting of their own.

None of verl, OpenRLHF or NeMo RL takes a revision: given a hub id they load whatever ``main``
is. A spec that pins a 40-hex commit is therefore launched with the local path of exactly that
snapshot in the Hugging Face cache: if it was not fetched beforehand the engine fails to
load it, instead of silently training a different model.
"""

from __future__ import annotations

import os
import re
from typing import Any

from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import Outcome, Pinned, Refused

HUB_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_snapshot(repo_id: str, commit: str) -> str:
    """The Hugging Face cache directory of one commit of a model repository."""
    cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    return os.path.join(cache, "models--" + repo_id.replace("/", "--"), "snapshots", commit)


def pinned_model_path(spec: ExperimentSpec) -> str:
    revision = spec.model.revision
    if revision and HUB_COMMIT.match(revision):
        return hub_snapshot(spec.model.path, revision)
    return spec.model.path


def revision_outcome(engine: str) -> Any:
    """The rule for ``model.revision`` on an engine that loads ``model.path`` as given."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is None:
            return Pinned({}, "no revision pinned: the model path is loaded as given")
        if HUB_COMMIT.match(value):
            return Pinned({}, f"through the model path: {engine} loads the cached snapshot of "
                              "this commit")
        if value.startswith("sha256:"):
            return Pinned({}, "a local directory's content digest, recorded in the experiment "
                              "digest")
        return Refused(f"{engine} has no revision setting: pin a 40-hex commit (loaded from "
                        "the Hugging Face cache snapshot) or a local directory's sha256")

    return rule
