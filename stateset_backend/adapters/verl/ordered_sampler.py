"""verl's v1 replay buffer, handing each update's samples over in a fixed order (run directory
name: ``stateset_verl_sampler.py``; verl loads it by ``trainer.v1.sampler.custom_sampler``).

verl 0.9's v1 trainer writes each trajectory to its TransferQueue when it finishes generating,
and ``ReplayBuffer._materialize_batch`` hands the batch over in that order; the actor then cuts
it into ``ppo_mini_batch_size`` slices as they come. So which samples share an optimizer step
depends on which finished first: two runs of one launch, or a run and its resume, train on
different mini-batches (measured on verl 0.9.1: update 1's gradient norm 0.913 in one run,
1.157 in the next), and a mini-batch may hold parts of several groups. Here the batch is put
in the order the prompts were drawn (verl's ``prompt_global_steps`` keeps it), each prompt's
samples by their index, so a run repeats, and on one data-parallel rank every mini-batch is
whole groups in the dataloader's order, as the spec means (with several, verl's
``_balance_batch`` then deals the samples out to the ranks by length, the same way each run).
Where DAPO's filter leaves more finished groups than an update takes, the ones taken are the
oldest, in the order drawn.

verl builds a custom sampler with fewer arguments than its own (it leaves out DAPO's group
filter, the refill of failed groups and the batch sizes, trainer_base ``_build_replay_buffer``),
so this one is built as verl builds its own: the trainer's method, run once with the custom
sampler unset, gives the stock buffer, whose settings this one takes over.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class OrderedReplayBuffer(ReplayBuffer):
    def __init__(self, **given: Any) -> None:
        trainer = getattr(given.get("refill_fn"), "__self__", None)
        if trainer is None:  # built as verl 0.9 never builds one: DAPO's filter would be lost
            raise RuntimeError("stateset: verl built its custom sampler without a trainer to "
                               "ask for its settings (refill_fn is not a trainer's method)")
        from omegaconf import open_dict

        sampler = trainer.config.trainer.v1.sampler
        custom = sampler.custom_sampler
        with open_dict(sampler):
            sampler.custom_sampler = None
            try:
                stock = trainer._build_replay_buffer()
            finally:
                sampler.custom_sampler = custom
        if type(stock) is not ReplayBuffer:
            raise RuntimeError(f"stateset: verl built a {type(stock).__name__} for "
                               "trainer.v1.trainer_mode, not the sync ReplayBuffer this "
                               "ordering extends")
        self.__dict__.update(stock.__dict__)

    def _select_prompt_uids(self, partition_id: Any, sampleable_keys: Any,
                            batch_size: int) -> Any:
        """verl's pick (the oldest prompts first), its ties broken by the order the prompts
        were drawn in, not by the order of a set of strings, which changes per process: with
        DAPO's filter more groups finish than an update takes, and the cut must repeat."""
        _, snapshot, steps = super()._select_prompt_uids(partition_id, sampleable_keys,
                                                         len(sampleable_keys))
        drawn = {uid: i for i, uid in enumerate(steps)}
        ordered = sorted(sampleable_keys,
                         key=lambda uid: (steps.get(uid, 0), drawn.get(uid, len(drawn)), uid))
        return ordered[:batch_size], snapshot, steps

    def _materialize_batch(self, partition_id: Any, selected_prompt_uids: Any,
                           partition_snapshot: Any) -> Any:
        batch = super()._materialize_batch(partition_id, selected_prompt_uids,
                                           partition_snapshot)
        drawn = {uid: i for i, uid in enumerate(self.prompt_global_steps[partition_id])}

        def place(i: int) -> tuple[int, ...]:
            uid, *index = batch.keys[i].split("_")
            return (drawn.get(uid, len(drawn)), *(int(x) for x in index if x.isdigit()))

        batch.reorder(sorted(range(len(batch.keys)), key=place))
        return batch
