"""The native trainer loop: rollout → integrity check → learner update → receipts, metrics,
checkpoints. Each step lives in its own module; this file only composes them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stateset_backend.common.jsonio import atomic_write_json, put
from stateset_backend.native import checkpoint, grouped_llama, layout, objectives, options
from stateset_backend.native.batch import (
    ConversationBatch,
    RolloutBatch,
    check_batch,
    check_conversation_batch,
)
from stateset_backend.native.data import DataError, Example, PromptSampler, load_split, resolve
from stateset_backend.native.learner import (
    LearnerConfig,
    advantages_for,
    make_optimizer,
    reference_logprobs,
    update,
)
from stateset_backend.native.model import (
    compute_context,
    frozen_reference,
    load_policy,
    pick_device,
)
from stateset_backend.native.multiturn import conversation
from stateset_backend.native.multiturn.environment import (
    EnvironmentLoadError,
    EnvironmentRef,
    Workers,
    describe,
)
from stateset_backend.native.multiturn.settings import conversation_refusals
from stateset_backend.native.parallel.distributed import World
from stateset_backend.native.parallel.settings import data_parallel_refusals
from stateset_backend.native.ppo.critic import learn_ppo, load_critic, rollout_values
from stateset_backend.native.ppo.settings import ppo_refusals
from stateset_backend.native.progress import Progress
from stateset_backend.native.quarantine_guard import (
    StepCounter,
    learner_update_guard,
    quarantine_on_failure,
)
from stateset_backend.native.records import RecordWriter, ScalarLog, append_line, write_lines
from stateset_backend.native.reward import RewardFn, load_reward
from stateset_backend.native.rollout import group_generators, sample
from stateset_backend.native.texts import Decoder
from stateset_backend.providers.base import STOP_REQUEST
from stateset_backend.runs.lineage import STAGED_CHECKPOINT
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.model import LOWER_IS_BETTER, ExperimentSpec

Batch = RolloutBatch | ConversationBatch


class SettingsError(ValueError):
    """The launch config does not describe the experiment it claims to, or asks for something
    the native engine cannot do."""


Decoding = conversation.Decoding



class StopRequested(Exception):
    """Raised after the checkpoint the provider's stop request asked for: the run stops
    resumable at ``update``, with nothing half-written."""

    def __init__(self, update: int) -> None:
        super().__init__(f"stopped on request at update {update}, checkpoint written")
        self.update = update

def _refuse_unsupported(spec: ExperimentSpec, world: World) -> None:
    """Settings the native engine cannot honour stop the run before anything loads (the native
    contract refuses them earlier; this is the engine's own guard)."""
    if spec.algorithm.clip.dual_clip is not None and \
            objectives.RECIPES[spec.algorithm.objective][1] != "clipped":
        raise SettingsError(f"algorithm.clip.dual_clip applies to the clipped PPO surrogate; "
                            f"{spec.algorithm.objective} has no such loss")
    for problem in conversation_refusals(spec):
        raise SettingsError(problem)
    for problem in ppo_refusals(spec):
        raise SettingsError(problem)
    for problem in (data_parallel_refusals(spec) if world.parallel else []):
        raise SettingsError(problem)


@dataclass(frozen=True)
class RunSettings:
    run_id: str
    experiment_digest: str
    spec: ExperimentSpec
    base_dir: Path
    # how updates are computed, outside the identity (options.py): the launch's choice
    execution: dict[str, Any] = field(default_factory=lambda: dict(options.DEFAULTS))


def load_settings(path: Path) -> RunSettings:
    """Rebuild the spec from the flat native keys and prove the identity survived."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    nested: dict[str, Any] = {}
    for key, value in doc["settings"].items():
        put(nested, key, value)
    spec = parse_spec(nested, source=str(path))
    if experiment_digest(spec) != doc["experiment_digest"]:
        raise SettingsError("the launch config's settings do not hash to the experiment "
                            "digest it carries: the translation lost part of the experiment")
    execution = {**options.DEFAULTS, **doc.get("execution", {})}
    problems = options.problems(execution, spec)
    if problems:
        raise SettingsError(f"the launch config's execution options: {problems[0]}")
    return RunSettings(doc["run_id"], doc["experiment_digest"], spec,
                       Path(doc.get("base_dir") or Path.cwd()), execution)


@dataclass
class Outputs:
    """Where the engine writes, all inside the attempt directory. The per-update records go
    through ``records``, in order, off the training thread (records.RecordWriter)."""

    root: Path
    metrics: Path = field(init=False)
    receipts: Path = field(init=False)
    trajectories: Path = field(init=False)
    checkpoints: Path = field(init=False)
    final: Path = field(init=False)
    records: RecordWriter = field(init=False, default_factory=RecordWriter)

    def __post_init__(self) -> None:
        self.metrics = self.root / layout.METRICS_FILE
        self.receipts = self.root / layout.RECEIPTS_FILE
        self.trajectories = self.root / layout.TRAJECTORIES_DIR
        self.checkpoints = self.root / layout.CHECKPOINTS_DIR
        self.final = self.root / layout.FINAL_DIR

    def append(self, path: Path, row: dict[str, Any]) -> None:
        self.records.submit(functools.partial(append_line, path, row))

    def write_lines(self, path: Path, rows: list[dict[str, Any]]) -> None:
        self.records.submit(functools.partial(write_lines, path, rows))


class Trainer:
    def __init__(self, settings: RunSettings, output: Path, world: World | None = None) -> None:
        self.settings = spec_settings = settings
        self.spec = spec = spec_settings.spec
        self.out = Outputs(output)
        self.world = world or World()  # data parallel: this rank (distributed.join)
        self.device = pick_device()
        _refuse_unsupported(spec, self.world)
        self.compute = compute_context(spec.model, self.device)
        base = settings.base_dir
        self.conversations = spec.environment.kind != "single_turn"
        if self.conversations:  # before the model exists: the workers fork from a small process
            self._open_environment(base)
        self.model, self.tokenizer = load_policy(spec.model, spec.seed, base, self.device,
                                                 chat_template=spec.data.chat_template)
        if settings.execution["sampling.kernels"] != "exact" and \
                not grouped_llama.supports(self.model):
            raise SettingsError("sampling.kernels 'fast' decodes through the Llama-family "
                                "forward (llama, qwen2, mistral without a sliding window); "
                                f"{spec.model.path} samples through its own forward, which has "
                                "only the exact kernels")
        if spec.model.from_run is not None:  # before the KL reference copies the weights
            checkpoint.load_weights(output / STAGED_CHECKPOINT, spec.model.from_run.sha256,
                                    self.model)
        if spec.data.prompt_overflow == "truncate_left":
            self.tokenizer.truncation_side = "left"
        elif spec.data.prompt_overflow == "truncate_right":
            self.tokenizer.truncation_side = "right"
        self.reference = frozen_reference(self.model) if spec.algorithm.kl is not None else None
        # each prompt's token ids, tokenized once (fitting the prompts does it anyway), and
        # each distinct response decoded once
        self._prompt_tokens: dict[str, list[int]] = {}
        self.decode = Decoder(self.tokenizer)
        if self.conversations:
            train = load_split(spec.data.train, base)
            val = load_split(spec.data.validation, base) if spec.data.validation else []
            self.train_rows, self.val_rows = train, val
        else:
            self.reward_fn: RewardFn = load_reward(spec.reward, base)
            self.train_rows = self._fit_prompts(load_split(spec.data.train, base), "train")
            self.val_rows = (self._fit_prompts(load_split(spec.data.validation, base),
                                               "validation") if spec.data.validation else [])
        self.sampler = PromptSampler(len(self.train_rows), spec.seed, spec.data.shuffle)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.optimizer, self.scheduler = make_optimizer(self.model, spec.optim,
                                                        spec.budget.total_updates)
        self.steps = StepCounter(self.optimizer)  # tells a part-way update from a clean one
        self.scalars: ScalarLog | None = None
        self.learner_cfg = LearnerConfig(
            spec.algorithm, spec.rollout.temperature,
            self.limits.max_turns * self.limits.turn_tokens if self.conversations
            else spec.data.max_response_tokens,
            spec.budget.ppo_epochs, spec.budget.mini_batches, spec.optim.grad_clip, self.compute)
        # PPO: the learned critic, loaded like the policy and saved beside it
        self.critic = load_critic(spec, base, self.device) if spec.algorithm.gae else None
        self.update_count = 0
        self.resumed_from: int | None = None
        self.best: tuple[float, int] | None = None  # (select_by value, update) checkpointed
        # this update's global group count and this rank's block of it (data parallel)
        self.n_groups, self.owned = 0, range(0)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])

    def _open_environment(self, base: Path) -> None:
        env = self.spec.environment
        assert env.entrypoint is not None
        file_part, _, class_name = env.entrypoint.rpartition(":")
        self.env_ref = EnvironmentRef(resolve(file_part, base), class_name, env.sha256)
        self.tools = describe(self.env_ref, env.step_timeout_s)
        # forked now, while the process is small, and reused by every update and validation
        self.env_workers = Workers(self.env_ref, env.step_timeout_s)
        spec = self.spec
        self.env_workers.ensure(max(spec.budget.prompts_per_update * spec.algorithm.group_size,
                                    64 if spec.data.validation else 0))
        if env.kind == "tool_use" and not self.tools:
            raise EnvironmentLoadError("a tool_use environment declares no tools")
        if env.kind == "multi_turn" and self.tools:
            raise EnvironmentLoadError("the environment declares tools: its kind is tool_use")
        self.limits = conversation.Limits.from_spec(self.spec)
        self.last_collected: conversation.Collected | None = None

    # -- state ---------------------------------------------------------------------------
    def resume(self, directory: Path) -> None:
        with quarantine_on_failure(self.out.root, "restore", update=None):
            self._restore(directory)

    def _restore(self, directory: Path) -> None:
        checkpoint.refuse_other_world(directory, self.world.size)
        state = checkpoint.load(directory, experiment_digest=self.settings.experiment_digest,
                                model=self.model, optimizer=self.optimizer,
                                scheduler=self.scheduler, generator=self.generator,
                                critic=self.critic)
        self.sampler.load_state_dict(state.sampler)
        self.update_count = self.resumed_from = state.update

    def save_checkpoint(self) -> Path | None:
        """Every rank reports its data position; rank 0 alone writes (the ranks hold the same
        weights, optimizer and sampler: a position that differs means they diverged)."""
        positions = self.world.all_gather(
            {"rank": self.world.rank, "sampler": self.sampler.state_dict(),
             "groups": [self.owned.start, self.owned.stop],
             "generator_sha256": checkpoint.generator_digest(self.generator),
             # recorded: another thread count rounds the same math differently
             "intra_op_threads": torch.get_num_threads()})
        if not self.world.is_main:
            return None
        self.out.records.flush()  # no checkpoint exists whose records are not on disk
        with quarantine_on_failure(self.out.root, "checkpoint_write", update=self.update_count):
            shared = [(p["sampler"], p["generator_sha256"]) for p in positions]
            if any(s != shared[0] for s in shared):
                raise checkpoint.CheckpointError(
                    f"update {self.update_count}: the ranks' data positions or generator states "
                    "differ, so they no longer train one model: nothing is saved")
            path = self._write_checkpoint(positions)
        return path

    def _write_checkpoint(self, positions: list[dict[str, Any]]) -> Path:
        state = checkpoint.TrainerState(self.update_count, self.update_count,
                                        self.sampler.state_dict(), {})
        runtime = checkpoint.runtime_identity(self.spec, self.world.size, positions)
        return checkpoint.save(self.out.checkpoints, model=self.model,
                               optimizer=self.optimizer, scheduler=self.scheduler,
                               generator=self.generator, state=state,
                               experiment_digest=self.settings.experiment_digest,
                               keep=self.spec.checkpoint.keep, critic=self.critic,
                               runtime=runtime,
                               protect=self.best[1] if self.best is not None else None)

    def _track_best(self, metrics: dict[str, Any]) -> None:
        """The best checkpointed update by evaluation.select_by so far (ties: the earlier), as
        the core's selection ranks them, so that retention keeps it."""
        name = self.spec.evaluation.select_by
        value = metrics.get(name) if name is not None else None
        if not isinstance(value, float) or not math.isfinite(value):
            return
        lower = name in LOWER_IS_BETTER
        if self.best is None or (value < self.best[0] if lower else value > self.best[0]):
            self.best = (value, self.update_count)

    def log_metrics(self, row: dict[str, Any]) -> None:
        """One row to metrics.jsonl (the record) and to TensorBoard (a view of it)."""
        if not self.world.is_main:
            return
        row = dict(row)  # written later, as it is now
        self.out.append(self.out.metrics, row)
        self.out.records.submit(functools.partial(self._write_scalars, row))

    def _write_scalars(self, row: dict[str, Any]) -> None:
        if self.scalars is None:
            self.scalars = ScalarLog(self.out.root / layout.TENSORBOARD_DIR)
        self.scalars.write(row)

    def commit(self, durable: bool = True) -> None:
        """The run's progress record. Between checkpoints it is rewritten without fsync (two
        fsyncs an update cost more than a small model's whole update), by the record writer
        after the update's other records; at a checkpoint and at the end it is made durable,
        after every record before it is written, so after a power loss it agrees with the
        checkpoint a resume starts from."""
        if not self.world.is_main:
            return
        write = functools.partial(atomic_write_json, self.out.root / layout.RUN_INFO_FILE, {
            "engine": "native", "run_id": self.settings.run_id,
            "experiment_digest": self.settings.experiment_digest,
            "committed_updates": self.update_count, "resumed_from": self.resumed_from,
            "execution": self.settings.execution},
            durable=durable)
        if durable:
            self.out.records.flush()
            write()
        else:
            self.out.records.submit(write)

    # -- prompts -------------------------------------------------------------------------
    def _render(self, prompt: str) -> str:
        """A text prompt as one user message in the model's chat template, or as it is."""
        if not self.spec.data.chat_template:
            return prompt
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  tokenize=False, add_generation_prompt=True)
        return str(text)

    def _tokenize(self, texts: list[str], **kwargs: Any) -> Any:
        # a chat template writes its own special tokens
        return self.tokenizer(texts, add_special_tokens=not self.spec.data.chat_template,
                              **kwargs)

    def _fit_prompts(self, rows: list[Example], split: str) -> list[Example]:
        """Apply data.prompt_overflow to prompts longer than max_prompt_tokens: drop them here,
        refuse them, or leave them to be truncated when encoded."""
        data = self.spec.data
        if data.prompt_overflow in ("truncate_left", "truncate_right"):
            return rows
        lengths = [len(ids) for ids in self._prompt_ids([self._render(r.prompt) for r in rows])]
        over = [r for r, n in zip(rows, lengths, strict=True) if n > data.max_prompt_tokens]
        if over and data.prompt_overflow == "error":
            raise DataError(f"data.{split}: {len(over)} prompt(s) exceed max_prompt_tokens "
                            f"{data.max_prompt_tokens}, the first is row {over[0].index}")
        kept = [r for r, n in zip(rows, lengths, strict=True) if n <= data.max_prompt_tokens]
        if not kept:
            raise DataError(f"data.{split}: every prompt exceeds max_prompt_tokens "
                            f"{data.max_prompt_tokens}")
        return kept

    # -- rollout -------------------------------------------------------------------------
    def _prompt_ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each prompt, from the cache; the ones not seen yet tokenized at once."""
        new = [t for t in dict.fromkeys(texts) if t not in self._prompt_tokens]
        if new:
            self._prompt_tokens.update(zip(new, self._tokenize(new)["input_ids"], strict=True))
        return [self._prompt_tokens[t] for t in texts]

    def _encode(self, rows: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and mask, as the tokenizer pads them."""
        texts = [self._render(r.prompt) for r in rows]
        if self.spec.data.prompt_overflow in ("truncate_left", "truncate_right"):
            enc = self._tokenize(texts, padding=True, padding_side="left", truncation=True,
                                 max_length=self.spec.data.max_prompt_tokens,
                                 return_tensors="pt")
            return enc["input_ids"].to(self.device), enc["attention_mask"].float().to(self.device)
        seqs = self._prompt_ids(texts)
        width = max(len(ids) for ids in seqs)
        pad = self.tokenizer.pad_token_id
        # built as lists and made tensors at once: row by row it was a dozen operators a row
        ids = torch.tensor([[pad] * (width - len(t)) + t for t in seqs], dtype=torch.long)
        mask = torch.tensor([[0.0] * (width - len(t)) + [1.0] * len(t) for t in seqs])
        return ids.to(self.device), mask.to(self.device)

    def _rollout(self, indices: list[int], group_size: int, *, rows_source: list[Example],
                 decoding: Decoding,
                 generator: torch.Generator | list[torch.Generator]) -> RolloutBatch:
        rows = [rows_source[i] for i in indices for _ in range(group_size)]
        prompt_ids, prompt_mask = self._encode([rows_source[i] for i in indices])
        prompt_ids = prompt_ids.repeat_interleave(group_size, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(group_size, dim=0)
        spec = self.spec
        with self.compute():
            response_ids, response_mask, logps = sample(
                self.model, prompt_ids, prompt_mask,
                max_new_tokens=spec.data.max_response_tokens,
                temperature=decoding.temperature or 1.0, top_p=decoding.top_p,
                top_k=decoding.top_k, eos_id=self.tokenizer.eos_token_id,
                pad_id=self.tokenizer.pad_token_id, generator=generator,
                greedy=decoding.temperature == 0, group_size=group_size,
                max_total_tokens=getattr(spec.data, "max_total_tokens", None),
                kernels=self.settings.execution["sampling.kernels"])
        texts = self.decode(response_ids, response_mask)
        rewards = torch.tensor([self.reward_fn(r.prompt, t, r.answer)
                                for r, t in zip(rows, texts, strict=True)])
        overlong = spec.algorithm.overlong
        if overlong is not None:
            rewards = rewards + objectives.overlong_penalty(
                response_mask.sum(-1).cpu(), spec.data.max_response_tokens,
                overlong.buffer_tokens, overlong.penalty)
        groups = torch.arange(len(indices)).repeat_interleave(group_size)
        index = torch.tensor([r.index for r in rows])  # the data-set row of each prompt
        return RolloutBatch(prompt_ids.cpu(), prompt_mask.cpu(), response_ids.cpu(),
                            response_mask.cpu(), logps.cpu(), groups, index, rewards.float(),
                            self.update_count, texts=texts)

    def _converse(self, indices: list[int], group_size: int, *, rows_source: list[Example],
                  decoding: Decoding, generator: torch.Generator) -> conversation.Collected:
        env = self.spec.environment
        with self.compute():
            return conversation.collect(
                self.model, self.tokenizer, self.env_workers, self.tools, self.limits,
                [(rows_source[i].index, rows_source[i].row) for i in indices], group_size,
                decoding, generator, placement=env.reward_placement, gamma=env.turn_discount,
                policy_version=self.update_count)

    def collect_conversations(self) -> tuple[ConversationBatch | None, int, torch.Tensor]:
        """One update's conversations; refused when too many of them failed."""
        spec = self.spec
        collected = self._converse(
            self.sampler.take(spec.budget.prompts_per_update), spec.algorithm.group_size,
            rows_source=self.train_rows, decoding=Decoding(
                spec.rollout.temperature, spec.rollout.top_p, spec.rollout.top_k),
            generator=self.generator)
        self.last_collected = collected
        try:
            conversation.refuse_failed_share(collected, spec.environment.max_failed_share)
        except conversation.FailedShareExceeded:  # what failed is the evidence: keep it
            if self.world.is_main:
                self._write_conversations(collected)
                self.out.records.flush()
            raise
        batch = collected.batch
        if batch is not None and spec.algorithm.advantage.zero_variance_groups == "exclude":
            zero = objectives.zero_variance_groups(batch.rewards, batch.group_ids)
            for n in batch.conversation_index[zero].tolist():
                collected.excluded[n] = "its group's returns are all equal (zero variance)"
            if bool(zero.all()):
                batch = None
            elif bool(zero.any()):
                batch = batch.select(~zero)
        returns = torch.tensor([r for r in collected.returns if r is not None])
        return batch, 0, returns

    def collect_batch(self) -> tuple[Batch | None, int, torch.Tensor]:
        """Sample one update's batch; with dynamic sampling, refill excluded groups.

        Every group samples from its own generator (rollout.group_generators), keyed by its
        place among the update's groups, so a data-parallel rank that samples only its block
        draws what one process draws for those groups."""
        if self.conversations:
            return self.collect_conversations()
        alg, want = self.spec.algorithm, self.spec.budget.prompts_per_update
        exclude = alg.advantage.zero_variance_groups == "exclude"
        max_rounds = alg.dynamic_sampling.max_rounds if alg.dynamic_sampling else 0
        parts: list[RolloutBatch] = []
        sampled: list[torch.Tensor] = []
        have, rounds, drawn = 0, 0, 0
        while True:
            indices = self.sampler.take(want - have)  # the same global draw on every rank
            owned = self.world.groups(len(indices))
            self.n_groups, self.owned = len(indices), owned
            part = self._rollout(
                indices[owned.start:owned.stop], alg.group_size, rows_source=self.train_rows,
                decoding=Decoding(self.spec.rollout.temperature, self.spec.rollout.top_p,
                                  self.spec.rollout.top_k),
                generator=group_generators(self.spec.seed, self.update_count,
                                           range(drawn + owned.start, drawn + owned.stop)))
            drawn += len(indices)
            if self.critic is not None:  # recorded now, for exactly these completions
                with self.compute():
                    part.values = rollout_values(self.critic, part)
            sampled.append(part.rewards)
            if exclude:
                zero = objectives.zero_variance_groups(part.rewards, part.group_ids)
                part = part.select(~zero) if bool(zero.any()) else part
            if part.size:
                parts.append(part)
                have += part.size // alg.group_size
            if have >= want or rounds >= max_rounds:
                break
            rounds += 1
        return (RolloutBatch.concat(parts) if parts else None), rounds, torch.cat(sampled)

    # -- evaluation ----------------------------------------------------------------------
    @torch.no_grad()
    def validate(self, rows: list[Example] | None = None,
                 split: str = "validation") -> dict[str, float]:
        """Mean reward of evaluation.samples responses per validation prompt, decoded as
        evaluation says (temperature 0 = greedy). Sampling draws from its own generator, seeded
        per update, so validating never changes what training samples. ``rows`` (another
        split) is how `evaluate` scores a checkpoint through this same path."""
        rows = self.val_rows if rows is None else rows
        ev = self.spec.evaluation
        decoding = Decoding(ev.temperature, ev.top_p, None)
        generator = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + self.update_count)
        if self.conversations:
            return self._validate_conversations(decoding, generator, rows, split=split,
                                                record=rows is self.val_rows)
        rewards: list[float] = []
        chunk = max(1, 64 // ev.samples)
        for start in range(0, len(rows), chunk):
            idx = list(range(start, min(start + chunk, len(rows))))
            batch = self._rollout(idx, ev.samples, rows_source=rows,
                                  decoding=decoding, generator=generator)
            rewards.extend(batch.rewards.tolist())
        return {"val/reward/mean": sum(rewards) / len(rewards)}

    def _validate_conversations(self, decoding: Decoding, generator: torch.Generator,
                                rows: list[Example], *, split: str = "validation",
                                record: bool = False) -> dict[str, float]:
        """Mean return over validation conversations whose environment did not fail (failed
        ones have no return to average: they are counted, and held to the same
        environment.max_failed_share as training, so that a mean over the few survivors is
        never reported as the policy's). ``record`` writes every conversation, failed ones
        with their error, to the trajectories as ``validation-update-N.jsonl``."""
        chunk = max(1, 64 // self.spec.evaluation.samples)
        every = conversation.Collected.join([
            self._converse(list(range(start, min(start + chunk, len(rows)))),
                           self.spec.evaluation.samples, rows_source=rows, decoding=decoding,
                           generator=generator)
            for start in range(0, len(rows), chunk)])
        if record:  # on disk before the validation reports, or fails
            self._write_conversations(every, f"validation-update-{self.update_count:06d}.jsonl")
            self.out.records.flush()
        conversation.refuse_failed_share(every, self.spec.environment.max_failed_share,
                                         what=split)
        returns = [r for r in every.returns if r is not None]
        return {"val/reward/mean": sum(returns) / len(returns),
                "val/conversations/failed_share": every.failed / len(every.conversations)}

    # -- the loop ------------------------------------------------------------------------
    def train(self, until: int | None = None) -> None:
        """Train to ``total_updates`` (or stop after ``until``, as an interruption would)."""
        spec, out = self.spec, self.out
        total = spec.budget.total_updates
        stop = total if until is None else min(until, total)
        main = self.world.is_main  # validation, like every output, is rank 0's alone
        if main:  # the run directory is shared by every rank, on every node
            out.trajectories.mkdir(parents=True, exist_ok=True)
        self.commit()
        progress = Progress(total, start=self.update_count, quiet=not main)
        every_eval = spec.evaluation.every
        if every_eval and self.val_rows and self.update_count == 0 and main:
            self.log_metrics({"step": 0, **self.validate()})
        with progress, contextlib.closing(self):
            while self.update_count < stop:
                t0 = time.perf_counter()
                batch, rounds, sampled_rewards = self.collect_batch()
                with learner_update_guard(out.root, self.steps, self.update_count + 1):
                    metrics = self.learn(batch)
                if self.world.parallel:
                    sampled_rewards = torch.cat(self.world.all_gather(sampled_rewards))
                if sampled_rewards.numel():  # none when every conversation failed
                    metrics.update({"reward/mean": float(sampled_rewards.mean()),
                                    "reward/std": float(sampled_rewards.std())
                                    if sampled_rewards.numel() > 1 else 0.0})
                self.update_count += 1
                self.write_receipt(batch, rounds)
                if every_eval and self.val_rows and self.update_count % every_eval == 0 and main:
                    metrics.update(self.validate())
                elapsed = time.perf_counter() - t0
                tokens = float(batch.response_mask.sum()) if batch is not None else 0.0
                if self.world.parallel:
                    tokens = sum(self.world.all_gather(tokens))
                metrics.update({"step": self.update_count, "tokens_per_second":
                                tokens / elapsed if elapsed > 0 else 0.0,
                                "time/update_s": elapsed})
                self.log_metrics(metrics)
                every_ckpt = spec.checkpoint.every
                due = every_ckpt is not None and every_ckpt > 0 and \
                    self.update_count % every_ckpt == 0
                stopping = self.update_count < stop and self.stop_requested()
                if due or stopping:
                    self.save_checkpoint()
                    self._track_best(metrics)
                self.commit(durable=due or stopping or self.update_count >= stop)
                # the progress line too is written off the training thread, after the records
                self.out.records.submit(functools.partial(progress.advance, metrics))
                if stopping:
                    raise StopRequested(self.update_count)
        if self.update_count == total and main:
            self.save_final()

    def stop_requested(self) -> bool:
        """Whether the provider asked to checkpoint and stop (a cluster's warning before its
        time limit or a pre-emption); every rank takes rank 0's answer, so all stop together."""
        asked = self.world.is_main and (self.out.root / STOP_REQUEST).exists()
        if self.world.parallel:
            return bool(self.world.all_gather(asked)[0])
        return asked

    def close(self) -> None:
        """Write the records still queued (raising a failed write's error), and stop the
        environment's worker processes (a later rollout starts new ones)."""
        try:
            self.out.records.close()
        finally:
            if self.conversations:
                self.env_workers.close()
            if self.scalars is not None:
                self.scalars.close()
                self.scalars = None

    def learn(self, batch: Batch | None) -> dict[str, float]:
        extra = self._conversation_metrics() if self.conversations else {}
        if batch is None:  # every group had zero variance and was excluded: nothing to learn
            return {"groups/kept": 0.0, **extra}
        spec = self.spec
        if isinstance(batch, ConversationBatch):
            check_conversation_batch(batch, vocab_size=self.vocab_size,
                                     group_size=spec.algorithm.group_size)
        else:
            check_batch(batch, vocab_size=self.vocab_size, group_size=spec.algorithm.group_size,
                        critic=self.critic is not None)
        task_rewards = batch.rewards.clone()
        kl = spec.algorithm.kl
        ref_logp = token_penalty = None
        if kl is not None:
            with self.compute():
                ref_logp = reference_logprobs(self.model, self.reference, batch,
                                              spec.rollout.temperature,
                                              spec.algorithm.group_size)
            if kl.placement == "reward":
                sampled = torch.nan_to_num(batch.sample_logprobs, nan=0.0)
                kl_tokens = objectives.kl_estimate(sampled, ref_logp, kl.estimator,
                                                   kl.clamp)
                if self.critic is not None:  # PPO: per token, where GAE sees it
                    token_penalty = kl.coef * kl_tokens
                else:
                    batch.rewards = batch.rewards - \
                        kl.coef * (kl_tokens * batch.response_mask).sum(-1)
        if self.critic is not None:
            assert isinstance(batch, RolloutBatch) and spec.algorithm.gae is not None
            metrics = learn_ppo(
                self.model, self.optimizer, self.scheduler, self.critic, batch, ref_logp,
                token_penalty, self.learner_cfg, self.generator,
                update_policy=self.update_count >= spec.algorithm.gae.critic.warmup_updates)
        else:
            advantages = advantages_for(batch, spec.algorithm, spec.environment)
            parallel = self.world.parallel  # one process keeps the batch's own group count
            metrics = update(self.model, self.optimizer, self.scheduler, batch, advantages,
                             ref_logp, self.learner_cfg, self.generator, world=self.world,
                             n_groups=self.n_groups if parallel else None,
                             owned=self.owned if parallel else None)
        lengths = batch.response_mask.sum(-1)
        counts = torch.tensor([float(lengths.sum()), float(lengths.numel()),
                               float(int(batch.group_ids.max()) + 1)], dtype=torch.float64)
        if self.world.parallel:
            self.world.all_reduce(counts)
            mean_length = float(counts[0] / counts[1])
        else:  # as it always was: the float32 mean
            mean_length = float(lengths.mean())
        metrics.update({"response_length/mean": mean_length,
                        "groups/kept": float(counts[2]), **extra})
        if isinstance(batch, ConversationBatch):
            self._write_conversations()
        else:
            self._write_trajectories(batch, task_rewards)
        return metrics

    def _conversation_metrics(self) -> dict[str, float]:
        got = self.last_collected
        assert got is not None
        convs = got.conversations
        return {"conversations/failed_share": got.failed / len(convs),
                "conversations/excluded": float(len(got.excluded)),
                "conversations/turns_mean": sum(len(c.turn_rewards) for c in convs) /
                len(convs)}

    def write_receipt(self, batch: Batch | None, rounds: int) -> None:
        """What was learned from, kept apart from the trajectories themselves."""
        receipt: dict[str, Any] = {"update": self.update_count,
                                   "policy_version": self.update_count - 1,
                                   "extra_rounds": rounds}
        if isinstance(batch, ConversationBatch) or (batch is None and self.conversations):
            receipt.update(self._conversation_receipt(batch))
        elif batch is None:
            receipt.update(groups=[], samples=0, prompt_tokens=0, response_tokens=0)
        else:
            first = self.owned.start if self.world.parallel else 0  # global group ids
            groups = sorted({(int(g) + first, int(i)) for g, i in
                             zip(batch.group_ids.tolist(), batch.prompt_index.tolist(),
                                 strict=True)})
            local = {"groups": groups, "samples": batch.size,
                     "prompt_tokens": int(batch.prompt_mask.sum()),
                     "response_tokens": int(batch.response_mask.sum())}
            ranks = self.world.all_gather(local)
            receipt.update(groups=[{"group": g, "prompt_index": i}
                                   for r in ranks for g, i in r["groups"]],
                           **{k: sum(r[k] for r in ranks)
                              for k in ("samples", "prompt_tokens", "response_tokens")})
        if self.world.is_main:
            self.out.append(self.out.receipts, receipt)

    def _conversation_receipt(self, batch: ConversationBatch | None) -> dict[str, Any]:
        """Per update: every conversation, the turns it learned from (none when excluded, with
        the reason), and the token counts by role."""
        got = self.last_collected
        assert got is not None
        learned: dict[int, list[int]] = {}
        if batch is not None:
            for row, n in enumerate(batch.conversation_index.tolist()):
                turns = batch.turn_ids[row][batch.loss_mask[row].bool()].unique()
                learned[n] = [int(t) for t in turns.tolist()]
        rows = [{"conversation": n, "group": got.groups[n], "prompt_index": c.task_index,
                 "turns": len(c.turn_rewards), "ended_by": c.ended_by,
                 "learned_turns": learned.get(n, []),
                 **({"excluded": got.excluded[n]} if n in got.excluded else {})}
                for n, c in enumerate(got.conversations)]
        counts: dict[str, Any] = {"conversations": rows, "samples": len(learned),
                                  "failed": got.failed}
        if batch is None:
            return {**counts, "assistant_tokens": 0, "environment_tokens": 0}
        return {**counts, "assistant_tokens": int(batch.loss_mask.sum()),
                "environment_tokens": int((batch.roles == 1).sum())}

    def _write_conversations(self, got: conversation.Collected | None = None,
                             name: str | None = None) -> None:
        got = got if got is not None else self.last_collected
        assert got is not None
        path = self.out.trajectories / (name or f"update-{self.update_count + 1:06d}.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_lines(path, [{
            "conversation": n, "group": got.groups[n], "prompt_index": c.task_index,
            "messages": c.messages, "turn_rewards": c.turn_rewards,
            "return": got.returns[n], "ended_by": c.ended_by, "error": c.error,
            "excluded": got.excluded.get(n)} for n, c in enumerate(got.conversations)])

    def _write_trajectories(self, batch: RolloutBatch, rewards: torch.Tensor) -> None:
        """Rank 0 writes every rank's samples, in global group order (ranks hold contiguous
        blocks), so the file is the one a single process writes."""
        texts = batch.texts if batch.texts is not None else \
            self.decode(batch.response_ids, batch.response_mask)
        first = self.owned.start if self.world.parallel else 0
        rows = [{"group": group + first, "prompt_index": index, "response": text,
                 "reward": reward}
                for group, index, text, reward in zip(
                    batch.group_ids.tolist(), batch.prompt_index.tolist(), texts,
                    rewards.double().tolist(), strict=True)]
        every = [row for part in self.world.all_gather(rows) for row in part]
        if not self.world.is_main:
            return
        self.out.write_lines(
            self.out.trajectories / f"update-{self.update_count + 1:06d}.jsonl", every)

    def save_final(self) -> None:
        """The trained model (adapters only under LoRA), renamed into place when complete."""
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix=".final.", dir=self.out.root))
        self.model.save_pretrained(tmp, safe_serialization=True)
        self.tokenizer.save_pretrained(tmp)
        if self.out.final.exists():
            shutil.rmtree(self.out.final)
        tmp.rename(self.out.final)
