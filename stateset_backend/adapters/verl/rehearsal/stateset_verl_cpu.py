"""verl's own trainer on a machine without an accelerator: the pieces verl lets a plugin add.

verl imports this module in every one of its processes (the driver, the TaskRunner, each
FSDP worker, the rollout server) when ``VERL_USE_EXTERNAL_MODULES`` names it, as it would a
hardware vendor's plugin. It uses only verl's extension points and edits no file of verl:

- a ``cpu`` platform (``PlatformRegistry``, chosen by ``VERL_PLATFORM=cpu``): device ``cpu``,
  collectives over gloo, and the declared logical ``GPU`` slot as the Ray resource, because
  verl's resource pools count accelerators only;
- the ``hf`` rollout (``RolloutReplicaRegistry`` and the trainer-side ``_ROLLOUT_REGISTRY``),
  a transformers sampler in ``stateset_verl_hf_rollout``, since vLLM, SGLang and TensorRT-LLM
  ship no CPU build;
- two corrections where verl assumes an accelerator: the default process-group backend string
  (``cpu:gloo,cpu:gloo``, which torch refuses) and the reference model's pinned-memory offload
  (pinning needs a CUDA driver).

What it therefore tests is verl's: config resolution, data pipeline, reward loop, advantage
and loss, the FSDP2 update, weight sync calls, validation, checkpoint layout and logging. The
rollout is ours, so a rehearsal says nothing about vLLM or SGLang.

Which releases have the extension points (read from each release wheel): the module hook
(``VERL_USE_EXTERNAL_MODULES``), ``RolloutReplicaRegistry`` and ``_ROLLOUT_REGISTRY`` since
0.6.0; the platform registry (``verl.plugin.platform``) and ``VERL_ENGINE_DEVICE`` since 0.9.0.
Before 0.9.0 the device answers are fixed functions in ``verl/utils/device.py`` (on a host
without CUDA they ask Ray for ``NPU`` slots and NCCL collectives), with no registry to add a
platform to, so rehearsal needs verl >= 0.9.0 (0.9.1 is the release it runs with here).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed.fsdp as torch_fsdp
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

PLATFORM = "cpu"
ROLLOUT = "hf"
ROLLOUT_MODULE = "stateset_verl_hf_rollout"


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


class _CpuDeviceModule(types.ModuleType):
    """What verl reaches through ``get_torch_device()``: ``torch.cpu``, and answers for the
    ``torch.cuda`` calls ``torch.cpu`` lacks (memory statistics, cache release, device RNG),
    none of which means anything on the host."""

    def __init__(self) -> None:
        super().__init__("stateset_verl_cpu.device")
        for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction",
                     "reset_peak_memory_stats", "reset_accumulated_memory_stats",
                     "manual_seed", "manual_seed_all", "set_rng_state"):
            setattr(self, name, _nothing)
        for name in ("memory_allocated", "memory_reserved", "max_memory_allocated",
                     "max_memory_reserved"):
            setattr(self, name, _zero)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def mem_get_info(*args: Any) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def get_rng_state(*args: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def get_device_name(*args: Any) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(*args: Any) -> Any:
        return types.SimpleNamespace(name="cpu", total_memory=0)


DEVICE_MODULE = _CpuDeviceModule()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """The host as verl's accelerator. ``current_device`` is a ``torch.device``, not an index:
    verl moves tensors with ``.to(get_device_id())``, and ``.to(0)`` would mean ``cuda:0``."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    def current_device(self) -> Any:
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        return None  # the host RNG is verl's to seed (torch.manual_seed); a second seed resets it

    def manual_seed_all(self, seed: int) -> None:
        return None

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # the launch declares one logical GPU per process (+ray_kwargs.ray_init.num_gpus):
        # verl's placement groups ask for it, and nothing ever touches a device
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _gloo_default(init: Callable[..., Any]) -> Callable[..., Any]:
    """verl's default backend string names the device twice on the host (``cpu:gloo,
    cpu:gloo``); plain ``gloo`` is what it means. An explicit backend passes unchanged."""

    @functools.wraps(init)
    def initialize(timeout_second: int | None = None, backend: str | None = None) -> Any:
        return init(timeout_second=timeout_second, backend=backend or "gloo")

    return initialize


class UnpinnedCPUOffloadPolicy(torch_fsdp.CPUOffloadPolicy):
    """verl wraps the reference model with ``CPUOffloadPolicy(pin_memory=True)``; pinned
    pages need a CUDA driver, and on the host the parameters already live in host memory."""

    def __init__(self, pin_memory: bool = True) -> None:
        super().__init__(pin_memory=False)


def _install() -> None:
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM:
        # its corrections (gloo collectives, unpinned offload) would cripple a GPU run
        raise RuntimeError(f"{__name__} belongs to a rehearsal on the host's CPUs; it loads "
                           f"only with VERL_PLATFORM={PLATFORM}")
    import verl.utils.distributed as distributed
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    if not getattr(distributed.initialize_global_process_group_ray, "__wrapped__", None):
        distributed.initialize_global_process_group_ray = _gloo_default(
            distributed.initialize_global_process_group_ray)
    # before verl.utils.fsdp_utils copies the name (it is imported after plugins load)
    torch_fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[misc]
    fsdp_utils = sys.modules.get("verl.utils.fsdp_utils")
    if fsdp_utils is not None:
        fsdp_utils.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[attr-defined]

    def replica() -> type:
        from stateset_verl_hf_rollout import HFReplica

        return HFReplica

    RolloutReplicaRegistry.register(ROLLOUT, replica)
    _ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{ROLLOUT_MODULE}.HFServerAdapter"


_install()
