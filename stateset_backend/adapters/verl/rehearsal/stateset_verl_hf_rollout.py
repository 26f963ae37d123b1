"""The ``hf`` rollout a rehearsal runs verl with: transformers sampling behind verl's own
rollout interfaces, because no inference server verl supports has a CPU build.

verl's trainer talks to a rollout through three objects, and this module is each of them:
``HFReplica`` (what ``RolloutReplicaRegistry`` hands the LLM server manager: it starts the
servers), ``HFServer`` (the Ray actor the agent loop sends ``generate`` to: token ids in,
token ids and their log-probabilities out) and ``HFServerAdapter`` (what each FSDP worker
holds, in ``_ROLLOUT_REGISTRY``: it pushes the actor's weights after every update). Only the
colocated ("hybrid") layout verl's synchronous trainer uses is served.

Sampling follows what vLLM does with the same parameters: temperature, top-k, top-p, greedy
at temperature 0, stop at the model's end-of-sequence token, at most the configured response
length. A returned log-probability is the sampled token's under the temperature-scaled
distribution before top-k/top-p, which is what verl's actor recomputes, so the two agree to
rounding while policy and rollout hold the same weights. Each request draws from its own
generator, seeded from the rollout seed, the update, the prompt and how many times this update
has already seen that prompt: a group of identical prompts gets distinct samples, and a rerun
(or a resume) gets the same ones whatever order the requests arrive in. That count is kept by
one ``Occurrences`` actor for every replica, and the replica is not part of the seed: verl's
load balancer sends each request to the least busy replica, so with two ranks which replica
serves a prompt changes from run to run, and a per-replica seed would make every run sample
anew.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from collections.abc import Iterable
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.config import HFModelConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

ROLLOUT = "hf"
OCCURRENCES = f"{ROLLOUT}_rollout_occurrences"  # the one counter every replica asks
# sampling parameters verl's agent loops send; any other is refused rather than ignored
KNOWN_PARAMS = {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs",
                "max_tokens", "max_new_tokens", "seed", "ignore_eos"}


def server_name(replica_rank: int, node_rank: int) -> str:
    return f"{ROLLOUT}_server_{replica_rank}_{node_rank}"


def _filtered(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """The logits sampling draws from: beyond the top-k, and beyond the smallest set of
    tokens whose probability reaches top-p, nothing (the most likely token always stays)."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        beyond = probs.cumsum(dim=-1) - probs >= top_p
        ordered = ordered.masked_fill(beyond, -math.inf)
        logits = torch.full_like(logits, -math.inf).scatter(0, order, ordered)
    return logits


@torch.inference_mode()
def sample(model: Any, prompt_ids: list[int], *, max_tokens: int, temperature: float,
           top_k: int, top_p: float, stop_ids: set[int],
           generator: torch.Generator) -> tuple[list[int], list[float]]:
    """One completion and the log-probability of each of its tokens."""
    tokens: list[int] = []
    logprobs: list[float] = []
    past = None
    step_input = torch.tensor([prompt_ids], dtype=torch.long)
    for _ in range(max_tokens):
        out = model(input_ids=step_input, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        if temperature > 0:
            scaled = logits / temperature
            probs = torch.softmax(_filtered(scaled, top_k, top_p), dim=-1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            scaled = logits
            token = int(torch.argmax(logits))
        tokens.append(token)
        logprobs.append(float(torch.log_softmax(scaled, dim=-1)[token]))
        if token in stop_ids:
            break
        step_input = torch.tensor([[token]], dtype=torch.long)
    return tokens, logprobs


def _stop_ids(model: Any) -> set[int]:
    ids: set[int] = set()
    for source in (model.generation_config, model.config):
        eos = getattr(source, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return ids


@ray.remote(num_cpus=0)
class Occurrences:
    """How many times this update has already asked for each prompt, across the replicas."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int | None, tuple[int, ...]], int] = {}

    def next(self, step: int | None, prompt_ids: tuple[int, ...]) -> int:
        occurrence = self.seen.get((step, prompt_ids), 0)
        self.seen[(step, prompt_ids)] = occurrence + 1
        return occurrence


class HFServer:
    """One replica's sampler: the model on the host, answering ``generate`` one request at a
    time (the agent loop sends them concurrently; a 2-core host gains nothing from more)."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        self.config = omega_conf_to_dataclass(config)
        model = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        override = dict(model.override_config or {})
        self.model = AutoModelForCausalLM.from_pretrained(
            model.local_path, dtype=PrecisionType.to_dtype(self.config.dtype),
            attn_implementation=override.get("attn_implementation", "sdpa"),
            trust_remote_code=model.trust_remote_code).eval()
        self.stop_ids = _stop_ids(self.model)
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        self.occurrences = Occurrences.options(  # type: ignore[attr-defined]
            name=OCCURRENCES, get_if_exists=True).remote()

    async def _generator(self, prompt_ids: list[int], seed: int | None) -> torch.Generator:
        occurrence = await self.occurrences.next.remote(self.global_steps, tuple(prompt_ids))
        base = self.config.seed if seed is None else seed
        text = f"{base}:{self.global_steps}:{occurrence}:{prompt_ids}"
        digest = hashlib.sha256(text.encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       **kwargs: Any) -> TokenOutput:
        unknown = sorted(set(sampling_params) - KNOWN_PARAMS)
        if unknown or image_data is not None or video_data is not None:
            raise NotImplementedError(f"the rehearsal's hf rollout samples text with "
                                      f"{sorted(KNOWN_PARAMS)}; it was asked for "
                                      f"{unknown or 'images or video'}")
        params = dict(sampling_params)
        if float(params.get("repetition_penalty", 1.0)) != 1.0:
            raise NotImplementedError("the rehearsal's hf rollout has no repetition penalty")
        prompt_ids = [int(t) for t in prompt_ids]
        room = self.config.prompt_length + self.config.response_length - len(prompt_ids)
        limit = params.get("max_tokens", params.get("max_new_tokens",
                                                     self.config.response_length))
        max_tokens = max(1, min(int(limit), room))
        stop = set() if params.get("ignore_eos") else self.stop_ids
        generator = await self._generator(prompt_ids, params.get("seed"))
        tokens, logprobs = sample(
            self.model, prompt_ids, max_tokens=max_tokens,
            temperature=float(params.get("temperature", 1.0)),
            top_k=int(params.get("top_k", -1)), top_p=float(params.get("top_p", 1.0)),
            stop_ids=stop, generator=generator)
        return TokenOutput(token_ids=tokens,
                           log_probs=logprobs if params.get("logprobs") else None,
                           stop_reason="completed",
                           extra_fields={"global_steps": self.global_steps})

    async def load_weights(self, named: dict[str, torch.Tensor],
                           global_steps: int | None) -> None:
        """The actor's weights, whole; a name the model lacks fails the run rather than
        leaving the rollout sampling from stale weights."""
        dtype = next(self.model.parameters()).dtype
        result = self.model.load_state_dict({k: v.to(dtype) for k, v in named.items()},
                                            strict=False)
        tied = {k for k in result.missing_keys if k.endswith("lm_head.weight")} \
            if self.model.config.tie_word_embeddings else set()
        if result.unexpected_keys or set(result.missing_keys) - tied:
            raise RuntimeError(f"weight sync to the hf rollout: unexpected "
                               f"{result.unexpected_keys[:5]}, missing "
                               f"{sorted(set(result.missing_keys) - tied)[:5]}")
        await self.set_global_steps(global_steps)

    async def ready(self) -> None:
        return None

    async def set_global_steps(self, global_steps: int | None) -> None:
        if global_steps is not None:
            self.global_steps = global_steps

    async def abort_all_requests(self, **kwargs: Any) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, **kwargs: Any) -> dict[str, Any]:
        return {"aborted": False, "request_id": request_id}

    # memory and scheduling controls of a GPU server: nothing to free or resume on the host
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """Starts one ``HFServer`` per node of a replica, beside the FSDP workers it serves."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(f"the rehearsal's hf rollout serves the colocated "
                                      f"(hybrid) layout only, not {self.rollout_mode}")
        nodes = await asyncio.gather(*[
            worker.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            for worker in self.workers])
        server_class = ray.remote(HFServer)
        for node_rank in range(self.nnodes):
            server = server_class.options(
                name=server_name(self.replica_rank, node_rank),
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node_id=nodes[node_rank * self.gpus_per_replica_node], soft=False),
                max_concurrency=self.max_concurrency,
            ).remote(config=self.config, model_config=self.model_config,
                     replica_rank=self.replica_rank)
            self.servers.append(server)
        await asyncio.gather(*[server.ready.remote() for server in self.servers])  # loaded
        self._server_handle = self.servers[0]
        self._server_address = f"{ROLLOUT}-rehearsal-replica-{self.replica_rank}"


class HFServerAdapter(BaseRollout):
    """Each FSDP worker's side of the rollout: pushes the weights it is handed to the server
    of its replica (the first rank of each replica does; every rank drains the weights,
    whose gathering is collective)."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any,
                 replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        local_world_size = int(os.environ.get("RAY_LOCAL_WORLD_SIZE", "1"))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.node_rank = self.rollout_rank // local_world_size
        self.server: Any = None

    def _server(self) -> Any:
        if self.rollout_rank != 0:
            return None
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank, self.node_rank))
        return self.server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                             wire_format: str = "named_tensors", global_steps: int | None = None,
                             peft_config: Any = None, **kwargs: Any) -> None:
        if wire_format != "named_tensors" or peft_config is not None:
            raise NotImplementedError("the rehearsal's hf rollout takes whole named tensors "
                                      f"(asked for {wire_format}"
                                      f"{', a LoRA adapter' if peft_config else ''})")
        named = {name: tensor.detach().to("cpu").contiguous() for name, tensor in weights}
        server = self._server()
        if server is not None:
            await server.load_weights.remote(named, global_steps)
