"""Data parallelism, part by part and without launching processes: how groups are split, how
a rank's share of each loss aggregation adds up to the 1-process value, per-group sampling,
what several processes refuse, and how the launch is rendered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from stateset_backend.native import objectives
from stateset_backend.native.learner import split_groups
from stateset_backend.native.parallel.distributed import World, shard
from stateset_backend.native.rollout import group_generators, sample


@pytest.mark.parametrize(("n", "parts"), [(4, 2), (5, 2), (7, 3), (3, 3), (8, 1)])
def test_groups_split_into_balanced_contiguous_blocks_covering_each_group_once(n, parts):
    blocks = [shard(n, parts, r) for r in range(parts)]
    assert [g for b in blocks for g in b] == list(range(n))
    assert max(map(len, blocks)) - min(map(len, blocks)) <= 1


def test_every_aggregation_declares_what_it_divides_by():
    assert set(objectives.AGGREGATION_UNITS) == set(objectives.AGGREGATIONS)


@pytest.mark.parametrize("mode", sorted(objectives.AGGREGATIONS))
def test_rank_shares_of_an_aggregation_sum_to_the_whole_batch_value(mode):
    """Uneven lengths on purpose: per-rank means averaged would differ from the global one."""
    torch.manual_seed(0)
    values = torch.randn(12, 6, dtype=torch.float64)
    lengths = torch.tensor([1, 6, 2, 5, 3, 6, 1, 1, 4, 6, 2, 3])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).double()
    whole = objectives.aggregate(values, mask, mode, 6)
    total = objectives.aggregation_units(mask)
    rows = [torch.arange(0, 3), torch.arange(3, 12)]  # ranks holding unequal parts
    summed = sum(objectives.aggregate(values[r], mask[r], mode, 6) *
                 objectives.local_share(objectives.aggregation_units(mask[r]), total, mode)
                 for r in rows)
    naive = sum(objectives.aggregate(values[r], mask[r], mode, 6) for r in rows) / len(rows)
    assert torch.allclose(torch.as_tensor(summed), whole, atol=1e-12)
    assert not torch.allclose(torch.as_tensor(naive), whole, atol=1e-6)


def test_one_process_weighs_its_aggregate_by_exactly_one():
    mask = torch.ones(4, 3)
    units = objectives.aggregation_units(mask)
    assert all(objectives.local_share(units, units.clone(), m) == 1.0
               for m in objectives.AGGREGATIONS)


def test_each_rank_gets_its_own_groups_of_every_one_process_mini_batch():
    class Batch:  # split_groups reads only group ids
        group_ids = torch.arange(2).repeat_interleave(3)

    whole = split_groups(Batch(), 3, 2, torch.Generator().manual_seed(7), n_groups=4,
                         owned=range(0, 4))
    ranks = [split_groups(Batch(), 3, 2, torch.Generator().manual_seed(7), n_groups=4,
                          owned=owned) for owned in (range(0, 2), range(2, 4))]
    for step, rows in enumerate(whole):
        local = [set((ranks[0][step]).tolist()), {r + 6 for r in ranks[1][step].tolist()}]
        assert set(rows.tolist()) == local[0] | local[1]


def test_a_group_samples_the_same_alone_as_inside_the_whole_batch(tiny, make_trainer):
    trainer = make_trainer(tiny(**{"data.max_response_tokens": 6}))
    rows = [trainer.train_rows[i] for i in (0, 1, 2, 3) for _ in range(4)]
    kwargs = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0,
              "eos_id": trainer.tokenizer.eos_token_id,
              "pad_id": trainer.tokenizer.pad_token_id, "group_size": 4}
    ids, mask = trainer._encode(rows)
    whole, _, whole_lp = sample(trainer.model, ids, mask,
                                generator=group_generators(3, 5, range(0, 4)), **kwargs)
    ids, mask = trainer._encode(rows[8:])  # the second rank's block: groups 2 and 3
    part, _, part_lp = sample(trainer.model, ids, mask,
                              generator=group_generators(3, 5, range(2, 4)), **kwargs)
    width = part.shape[1]
    assert torch.equal(whole[8:, :width], part)
    assert torch.allclose(whole_lp[8:, :width], part_lp, atol=1e-5, equal_nan=True)
    other, _, _ = sample(trainer.model, ids, mask, generator=group_generators(3, 6, range(2, 4)),
                         **kwargs)
    assert not torch.equal(other, part)  # another update draws differently


# -- the launch ----------------------------------------------------------------------------
def _plan(cli, spec_file, tmp_path, doc):
    out = tmp_path / "plan.json"
    proc = cli("plan", "--engine", "native", spec_file(doc), "-o", out)
    return proc, (json.loads(out.read_text()) if proc.returncode == 0 else None)


def test_two_processes_launch_under_torchrun_as_an_argv_list(cli, tiny, spec_file, tmp_path):
    proc, plan = _plan(cli, spec_file, tmp_path, tiny(**{"resources.processes_per_node": 2}))
    assert proc.returncode == 0, proc.stderr
    argv = plan["argv"]
    assert argv[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                         "--nproc_per_node=2", "--max_restarts=0"]
    assert argv[7:9] == ["-m", "stateset_backend.native"]


def test_one_process_launches_the_engine_directly(cli, tiny, spec_file, tmp_path):
    proc, plan = _plan(cli, spec_file, tmp_path, tiny())
    assert proc.returncode == 0, proc.stderr
    assert plan["argv"][1:3] == ["-m", "stateset_backend.native"]
    assert "torch.distributed.run" not in plan["argv"]


def test_processes_are_not_identity(cli, tiny, spec_file, tmp_path):
    digests = []
    for processes in (None, 2):
        doc = tiny(**{"resources.processes_per_node": processes})
        proc = cli("digest", spec_file(doc))
        assert proc.returncode == 0, proc.stderr
        digests.append(proc.stdout.strip())
    assert digests[0] == digests[1]


@pytest.mark.parametrize(("changes", "named"), [
    ({"resources.nodes": 2}, "one torchrun agent on every node: slurm"),
    ({"algorithm.advantage": {"zero_variance_groups": "exclude"}}, "zero_variance_groups"),
    ({"budget.prompts_per_update": 1, "budget.mini_batches": 1}, "fewer than the 2 processes"),
])
def test_what_several_processes_cannot_do_exactly_is_refused_before_launch(
        cli, tiny, spec_file, tmp_path, changes, named):
    doc = tiny(**{"resources.processes_per_node": 2, **changes})
    proc, _ = _plan(cli, spec_file, tmp_path, doc)
    assert proc.returncode == 3, proc.stderr
    assert named in proc.stderr


def test_more_processes_than_gpus_is_invalid_input(cli, tiny, spec_file):
    doc = tiny(**{"resources.gpus_per_node": 1, "resources.processes_per_node": 2})
    proc = cli("validate", spec_file(doc))
    assert proc.returncode == 2
    assert "processes_per_node 2 exceeds gpus_per_node 1" in proc.stderr


def test_external_engines_refuse_a_process_count_of_their_own(tiny):
    from stateset_backend.spec.files import parse_spec
    from stateset_backend.translate.shared_rules import one_process_per_gpu

    rule = one_process_per_gpu("verl")
    spec = parse_spec(tiny(**{"resources.processes_per_node": 2}))
    assert type(rule(2, spec)).__name__ == "Refused"
    assert type(rule(None, spec)).__name__ == "NotApplicable"


def test_the_example_plans_two_processes(cli, tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "support-routing-ddp.json"
    out = tmp_path / "plan.json"
    proc = cli("plan", "--engine", "native", example, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "--nproc_per_node=2" in json.loads(out.read_text())["argv"]



# -- across nodes --------------------------------------------------------------------------
def _launch(doc, provider):
    """The native launch of ``doc`` as make_plan renders it for ``provider``."""
    from packaging.version import Version

    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.engines.adapter import LaunchContext
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec
    from stateset_backend.translate.rules import translate

    spec, adapter = parse_spec(doc), NativeAdapter()
    dialect = adapter.contract.dialect(Version("0.1.0"))
    translation = translate(spec, adapter.rules(dialect), dialect, "native", "0.1.0")
    ctx = LaunchContext("20260101T000000Z-00000000", experiment_digest(spec), "0.1.0",
                        dialect, None, provider)
    return adapter.render(translation, spec, ctx)


def test_a_plan_across_nodes_is_refused_for_a_provider_on_one_machine(cli, tiny, spec_file,
                                                                        tmp_path):
    doc = tiny(**{"resources.nodes": 2})
    for provider in ("local", "ray"):
        out = tmp_path / f"{provider}.json"
        proc = cli("plan", "--engine", "native", "--provider", provider, spec_file(doc),
                   "-o", out)
        assert proc.returncode == 3, proc.stderr
        assert f"the {provider} provider starts the native engine's processes on one " \
            "machine" in proc.stderr and "slurm" in proc.stderr
        assert not out.exists()


def test_across_nodes_every_node_runs_one_argv_and_the_provider_adds_the_rendezvous(tiny):
    from stateset_backend.adapters.native.adapter import node_argv
    from stateset_backend.plugin import PYTHON, RUN_DIR

    argv = _launch(tiny(**{"resources.nodes": 3, "resources.processes_per_node": 2,
                           "budget.prompts_per_update": 6}), "slurm").argv
    engine = ["-m", "stateset_backend.native", "--config", f"{RUN_DIR}/native_config.json",
              "--output", RUN_DIR]
    assert argv == [PYTHON, "-m", "torch.distributed.run", "--nnodes=3", "--nproc_per_node=2",
                    "--max_restarts=0", *engine]  # the rendezvous: PET_RDZV_* on each node
    resumed = [*argv, "--resume-from", "/shared/ckpt"]
    node = node_argv(resumed, node_rank="$SLURM_NODEID", endpoint="node-a:29500",
                     rendezvous_id="run-1")
    assert node == [PYTHON, "-m", "torch.distributed.run", "--nnodes=3", "--nproc_per_node=2",
                    "--max_restarts=0", "--rdzv-backend=c10d", "--rdzv-endpoint=node-a:29500",
                    "--rdzv-id=run-1", "--node-rank=$SLURM_NODEID", *engine,
                    "--resume-from", "/shared/ckpt"]
    static = node_argv(argv, node_rank=2, endpoint="10.0.0.1:29500", rendezvous_id="r",
                       static=True, local_addr="10.0.0.3")
    assert static[6:11] == ["--rdzv-backend=static", "--master-addr=10.0.0.1",
                            "--master-port=29500", "--rdzv-id=r", "--node-rank=2"]
    assert static[11] == "--local-addr=10.0.0.3"
    # torchrun's own parser reads it back as meant, once the caller filled in the node's rank
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args([a.replace("$SLURM_NODEID", "1") for a in node[3:]])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint,
            args.rdzv_id, args.node_rank, args.module, args.training_script) == \
        ("3", "2", "c10d", "node-a:29500", "run-1", 1, True, "stateset_backend.native")
    assert args.training_script_args[-2:] == ["--resume-from", "/shared/ckpt"]


def test_one_node_keeps_standalone_and_takes_a_given_rendezvous_instead(tiny):
    from stateset_backend.adapters.native.adapter import node_argv

    argv = _launch(tiny(**{"resources.processes_per_node": 2}), "local").argv
    assert "--standalone" in argv
    node = node_argv(argv, node_rank=0, endpoint="127.0.0.1:29400", rendezvous_id="r")
    assert "--standalone" not in node and "--nnodes=1" in node
    assert node.count("--rdzv-endpoint=127.0.0.1:29400") == 1
    assert node_argv(node, node_rank=0, endpoint="127.0.0.1:1", rendezvous_id="s").count(
        "--rdzv-backend=c10d") == 1  # a rendezvous replaces the one there, never doubles it


@pytest.mark.parametrize(("changes", "says"), [
    ({"node_rank": 2}, "node_rank 2"),
    ({"node_rank": True}, "node_rank True"),
    ({"node_rank": "1; rm -rf /"}, "placeholder"),
    ({"endpoint": "0.0.0.0:29500"}, "reachable from every node"),
    ({"endpoint": "host"}, "HOST:PORT"),
    ({"endpoint": "host:70000"}, "HOST:PORT"),
    ({"endpoint": "-h:1"}, "HOST:PORT"),
    ({"rendezvous_id": "a b"}, "rendezvous_id"),
    ({"local_addr": "a b"}, "local_addr"),
])
def test_node_argv_refuses_what_is_no_place_in_a_rendezvous(tiny, changes, says):
    from stateset_backend.adapters.native.adapter import node_argv

    argv = _launch(tiny(**{"resources.nodes": 2}), "slurm").argv
    given = {"node_rank": 1, "endpoint": "node-a:29500", "rendezvous_id": "r", **changes}
    with pytest.raises(ValueError, match=says):
        node_argv(argv, **given)


def test_a_single_process_has_no_rendezvous(tiny):
    from stateset_backend.adapters.native.adapter import node_argv

    with pytest.raises(ValueError, match="not a torchrun launch"):
        node_argv(_launch(tiny(), "local").argv, node_rank=0, endpoint="h:1",
                  rendezvous_id="r")


def test_where_the_ranks_run_is_not_identity(cli, tiny, spec_file):
    digests = set()
    for resources in ({"processes_per_node": 2}, {"nodes": 2, "processes_per_node": 1}):
        proc = cli("digest", spec_file(tiny(resources=resources)))
        assert proc.returncode == 0, proc.stderr
        digests.add(proc.stdout.strip())
    assert len(digests) == 1

# -- the runtime a resume must match -------------------------------------------------------
RUNTIME = {"world_size": 2, "model": {"path": "builtin:tiny", "revision": None},
           "versions": {"torch": "2.1", "transformers": "4.0", "stateset-backend": "0.1.0"}}


def test_the_same_runtime_resumes_without_warnings():
    from stateset_backend.runs.runtime import check_resume

    assert check_resume(RUNTIME, json.loads(json.dumps(RUNTIME)), allow_change=False,
                        where="run r") == []
    assert check_resume(None, RUNTIME, allow_change=False, where="run r") == []


@pytest.mark.parametrize("allow", [False, True])
def test_another_world_size_or_model_is_never_resumed(allow):
    from stateset_backend.common.errors import ResumeImpossible
    from stateset_backend.runs.runtime import check_resume

    with pytest.raises(ResumeImpossible, match="world_size: the checkpoint has 2, this launch 4"):
        check_resume(RUNTIME, {**RUNTIME, "world_size": 4}, allow_change=allow, where="run r")
    with pytest.raises(ResumeImpossible, match="model:"):
        check_resume(RUNTIME, {**RUNTIME, "model": {"path": "other", "revision": None}},
                     allow_change=allow, where="run r")


def test_changed_versions_need_the_users_leave_and_then_warn():
    from stateset_backend.common.errors import ResumeImpossible
    from stateset_backend.runs.runtime import check_resume

    newer = {**RUNTIME, "versions": {**RUNTIME["versions"], "torch": "2.2"}}
    with pytest.raises(ResumeImpossible, match=r"torch 2.1 -> 2.2 .*--allow-runtime-change"):
        check_resume(RUNTIME, newer, allow_change=False, where="run r")
    assert check_resume(RUNTIME, newer, allow_change=True, where="run r") == [
        "resumed under changed package versions: torch 2.1 -> 2.2"]


def test_the_engine_refuses_a_checkpoint_of_another_world_size(tiny, make_trainer):
    from stateset_backend.native.checkpoint import CheckpointError

    trainer = make_trainer(tiny(**{"budget.total_updates": 2, "evaluation.every": None}))
    trainer.train()
    newest = sorted(trainer.out.checkpoints.iterdir())[-1]
    runtime = json.loads((newest / "runtime.json").read_text())
    assert runtime["world_size"] == 1 and [r["rank"] for r in runtime["ranks"]] == [0]
    other = make_trainer(tiny(), "other")
    other.world = World(0, 2, 0)  # as a rank of two would be
    with pytest.raises(CheckpointError, match="written by 1 process"):
        other.resume(newest)


def test_allow_runtime_change_needs_resume(cli, tiny, spec_file):
    proc = cli("run", "--engine", "native", "--allow-runtime-change", spec_file(tiny()))
    assert proc.returncode == 2 and "applies to --resume only" in proc.stderr


def test_ranks_whose_positions_differ_save_no_checkpoint(tiny, make_trainer):
    from stateset_backend.native.checkpoint import CheckpointError

    class Diverged(World):
        def all_gather(self, obj):
            return [obj, {**obj, "rank": 1, "generator_sha256": "0" * 64}]

    trainer = make_trainer(tiny(**{"evaluation.every": None}))
    trainer.world = Diverged()
    with pytest.raises(CheckpointError, match="no longer train one model"):
        trainer.save_checkpoint()
    assert not trainer.out.checkpoints.exists() or not any(trainer.out.checkpoints.iterdir())
