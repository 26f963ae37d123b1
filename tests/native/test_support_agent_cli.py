"""examples/support-agent.json runs end to end through the CLI (a few updates)."""

from __future__ import annotations

import json

from native.agent_support import agent_spec


def test_support_agent_example_runs(cli, spec_file, tmp_path):
    doc = agent_spec(**{"algorithm": {"objective": "grpo", "group_size": 4},
                        "budget.total_updates": 3, "budget.prompts_per_update": 4,
                        "evaluation": {"every": 3, "select_by": "val/reward/mean"},
                        "checkpoint": {"every": 3, "keep": 1}})
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "native", "--runs-dir", runs, spec_file(doc))
    assert proc.returncode == 0, proc.stderr
    (result,) = runs.glob("*/result.json")
    res = json.loads(result.read_text())
    assert res["status"] == "succeeded" and res["committed_updates"] == 3
    attempt = result.parent / "attempts" / str(res["attempt"])
    rows = [json.loads(x) for x in (attempt / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/reward/mean" in r] == [0, 3]
    assert all(r["conversations/failed_share"] == 0.0 for r in rows if r["step"] > 0)
    receipts = [json.loads(x) for x in (attempt / "receipts.jsonl").read_text().splitlines()]
    assert [len(r["conversations"]) for r in receipts] == [16, 16, 16]


def test_the_example_spec_plans_on_the_native_contract(cli):
    from native.agent_support import EXAMPLES

    proc = cli("plan", "--engine", "native", EXAMPLES / "support-agent.json")
    assert proc.returncode == 0, proc.stderr
