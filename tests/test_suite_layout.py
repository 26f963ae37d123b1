"""The suite's own parallel layout: with pytest-xdist's ``--dist loadgroup`` (pyproject's addopts)
a test marked ``xdist_group`` carries its group in its id, and that is how the controller keeps
a group on one worker (what a module-scoped fixture trains is trained once; one test Slurm, one
Ray head at a time). A pytest whose ids lose the group would spread the groups silently."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite-layout")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request: pytest.FixtureRequest):
    if getattr(request.config.option, "loadgroup", False):  # on a loadgroup worker
        assert request.node.nodeid.endswith("@suite-layout"), (
            f"pytest {pytest.__version__} with pytest-xdist's loadgroup lost the group of "
            f"{request.node.nodeid}: install the versions the test extra names, or run the "
            "suite in one process with -n 0")
