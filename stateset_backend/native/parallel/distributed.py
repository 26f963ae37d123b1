"""Data parallelism for the native engine: who this process is, which groups it owns, and the
few collectives the trainer needs.

The split is chosen so that N processes compute the 1-process experiment: every rank draws the
same prompts from the same global sampler, owns a contiguous block of whole groups (group
advantages never cross ranks), samples each group from that group's own generator, and adds
its share of the globally aggregated loss; the summed gradients are then the 1-process
gradients. A single process (no ``WORLD_SIZE`` above 1 in the environment) never touches
``torch.distributed`` at all.

Nothing here depends on how the ranks are spread over nodes: the split and the writer (global
rank 0) come from the global ``RANK`` and ``WORLD_SIZE`` torchrun sets, and only the device is
the node's own (``LOCAL_RANK``: one GPU per process on each node). Two nodes of one process
and one node of two processes compute the same update.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch


class DistributedError(RuntimeError):
    """The process group is not the one the launch asked for."""


@dataclass(frozen=True)
class World:
    rank: int = 0  # global: which groups it owns, whether it writes
    size: int = 1
    local_rank: int = 0  # on its node: which GPU it drives
    node: int = 0  # its node's rank (torchrun's GROUP_RANK), for messages
    # where collectives run: NCCL reduces only CUDA tensors, gloo CPU ones
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes metrics, receipts, trajectories, checkpoints and the model."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def groups(self, n_groups: int) -> range:
        """This rank's contiguous block of an update's ``n_groups`` groups: balanced (sizes
        differ by at most one) and the same on every rank, so nothing needs to be sent."""
        return shard(n_groups, self.size, self.rank)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (the identity in one process)."""
        if self.parallel:
            import torch.distributed as dist

            here = tensor if tensor.device == torch.device(self.device) else \
                tensor.to(self.device)
            dist.all_reduce(here, op=dist.ReduceOp.SUM)
            if here is not tensor:
                tensor.copy_(here)
        return tensor

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (small, picklable things only)."""
        if not self.parallel:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.parallel:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.parallel:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def shard(n_items: int, parts: int, index: int) -> range:
    """Items ``[index * n // parts, (index + 1) * n // parts)``: the balanced contiguous split."""
    return range(index * n_items // parts, (index + 1) * n_items // parts)


def intra_op_threads(env: dict[str, str] | None = None) -> int:
    """Threads for this process's tensor math, chosen the same way on every layout: the count
    the launch set (``OMP_NUM_THREADS``: the user's, or the Slurm batch script's share of the
    CPUs it was given), else the scheduler's CPUs of this node shared among its processes,
    else torch's own default. Its reductions round differently with another count, so
    2 nodes x 1 process and 1 node x 2 processes agree bit for bit only with the same one."""
    env = dict(os.environ) if env is None else env
    given = env.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and int(cpus) > 0:
        return max(1, int(cpus) // max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1)))
    return torch.get_num_threads()


def join(expected_size: int) -> World:
    """This process's place in the group torchrun started (or a world of one), after checking
    it is the size the spec's resources asked for: a mismatch would train another batch split
    than the one planned."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(intra_op_threads())
    if size != expected_size:
        raise DistributedError(f"the launch asked for {expected_size} process(es) but "
                               f"{size} were started")
    if size == 1:
        return World()
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("GROUP_RANK", "0"))
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if local_rank >= visible:
            raise DistributedError(f"local rank {local_rank} on node {node} has no GPU: the "
                                   f"node shows {visible}; start at most one process per GPU "
                                   "on each node")
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", f"cuda:{local_rank}"
    else:
        backend, device = "gloo", "cpu"
    # a rank that dies leaves the others blocked in a collective: torchrun ends them; this
    # timeout is only the backstop when nothing else does
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=10))
    return World(rank, size, local_rank, node, device)


def all_reduce_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """Sum every rank's gradients in one flat buffer (a rank without rows this step adds
    zeros). Each rank's loss already carries its share of the global aggregation, so the sum
    is the gradient one process would have computed over the whole mini-batch. A parameter no
    rank produced a gradient for keeps none, as in one process (AdamW then skips it instead of
    decaying it)."""
    if not world.parallel:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    present = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype,
                           device=grads[0].device)
    flat = world.all_reduce(torch.cat([*(g.reshape(-1) for g in grads), present]))
    offset = 0
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone() \
            if float(flat[-len(params) + i]) > 0 else None
        offset += n
