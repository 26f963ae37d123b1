"""Run with verl's own interpreter: the precision of every model a verl release builds for a
launch, decided by that release's own code.

Reads a JSON list of jobs on stdin, each ``{"verl": <a release's verl package folder>,
"installed": <whether it is the importable verl>, "overrides": [...]}``, and prints a JSON list:
for each, ``{"actor" | "ref" | "critic": {"load", "param", "reduce", "buffer", "autocast",
"compute"}}`` (torch dtype names), or ``{"error": traceback}``.

The launch is composed on the release's own Hydra config. The dtypes come from the release's
own worker source: the statements of the function that builds each model (the dtype it loads
the weights in, the FSDP MixedPrecision it wraps them with) and the autocast its forward runs
under are taken from the release's files and executed on the composed config, with the
release's own ``PrecisionType``. The installed release also turns each section into verl's own
config dataclass first, as its trainer and workers do; an older release's section is read as
composed (a key its config lacks reads as absent, which is its dataclass default, None).
``compute`` is the dtype the forward's matmuls run in: the autocast dtype where torch honours
it (bfloat16, float16), else the FSDP param dtype (a float32 autocast is disabled).
"""

import ast
import importlib.util
import json
import os
import sys
import traceback
import types

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

# the names the builders compute a model's dtypes in
DTYPE_NAMES = {"torch_dtype", "mixed_precision_config", "param_dtype", "reduce_dtype",
               "buffer_dtype", "fsdp_config"}
DECIDING = {"torch_dtype", "mixed_precision_config"}


class _Section:
    """A composed config section read the way a dataclass is: absent keys are None."""

    def __init__(self, node):
        self._node = node

    def __getattr__(self, name):
        value = self._node.get(name, None)
        return _Section(value) if OmegaConf.is_dict(value) else value

    def get(self, name, default=None):
        value = self._node.get(name, default)
        return _Section(value) if OmegaConf.is_dict(value) else value


def _tree(verl, path):
    with open(os.path.join(verl, path), encoding="utf-8") as fh:
        return ast.parse(fh.read()), path


def _function(source, cls, name):
    tree, path = source
    found = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in found.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return fn, path


def _deciding(fn):
    """The function's top-level statements that decide the dtypes: assignments to the dtype
    names (and the engine's ``self._autocast_dtype``), and the ifs that test them."""
    out = []
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if (isinstance(target, ast.Name) and target.id in DTYPE_NAMES) or (
                    isinstance(target, ast.Attribute) and target.attr == "_autocast_dtype"):
                out.append(stmt)
        elif isinstance(stmt, ast.If) and DECIDING & {
                n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)}:
            out.append(stmt)
    return out


def _run(found, namespace):
    fn, path = found
    statements = _deciding(fn)
    assert statements, f"{path}: {fn.name} decides no dtype"
    exec(compile(ast.Module(statements, []), path, "exec"), namespace)
    return namespace


def _autocast(found, namespace):
    """The dtype of the ``torch.autocast`` the forward runs under, or None without one."""
    fn, path = found
    for node in ast.walk(fn):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "autocast":
                    dtype = next(k.value for k in call.keywords if k.arg == "dtype")
                    return eval(compile(ast.Expression(dtype), path, "eval"), namespace)
    return None


def _precision_type(verl):
    spec = importlib.util.spec_from_file_location(
        f"_torch_dtypes_{abs(hash(verl))}", os.path.join(verl, "utils", "torch_dtypes.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PrecisionType


def _report(ns, autocast):
    on = autocast in (torch.bfloat16, torch.float16)
    return {"load": str(ns["torch_dtype"]), "param": str(ns["param_dtype"]),
            "reduce": str(ns["reduce_dtype"]), "buffer": str(ns["buffer_dtype"]),
            "autocast": str(autocast) if on else None,
            "compute": str(autocast if on else ns["param_dtype"])}


def _legacy(verl, cfg, precision):
    """verl before 0.8 (and 0.6-0.7 with use_legacy_worker_impl auto): fsdp_workers builds the
    actor and the reference (the trainer gives the reference's worker the role 'ref'), the
    DataParallelPPOActor/Critic forward runs them."""
    workers = _tree(verl, "workers/fsdp_workers.py")
    actor_cls = _tree(verl, "workers/actor/dp_actor.py")
    critic_cls = _tree(verl, "workers/critic/dp_critic.py")
    out = {}
    for role, section in (("actor", cfg.actor_rollout_ref.actor),
                          ("ref", cfg.actor_rollout_ref.ref)):
        fsdp = _Section(section.fsdp_config)
        ns = _run(_function(workers, "ActorRolloutRefWorker", "_build_model_optimizer"),
                  {"torch": torch, "PrecisionType": precision, "fsdp_config": fsdp,
                   "self": types.SimpleNamespace(_is_actor=role == "actor")})
        forward = types.SimpleNamespace(config=_Section(section), device_name="cuda")
        init = _function(actor_cls, "DataParallelPPOActor", "__init__")[0]
        for stmt in init.body:  # the autocast dtype it keeps (0.6.1 on: fsdp_config.dtype)
            if isinstance(stmt, ast.Assign) and "param_dtype" in ast.unparse(stmt.targets[0]):
                exec(compile(ast.Module([stmt], []), "dp_actor.py", "exec"),
                     {"torch": torch, "PrecisionType": precision, "self": forward})
        out[role] = _report(ns, _autocast(
            _function(actor_cls, "DataParallelPPOActor", "_forward_micro_batch"),
            {"torch": torch, "self": forward}))
    ns = _run(_function(workers, "CriticWorker", "_build_critic_model_optimizer"),
              {"torch": torch, "PrecisionType": precision,
               "self": types.SimpleNamespace(config=_Section(cfg.critic))})
    out["critic"] = _report(ns, _autocast(
        _function(critic_cls, "DataParallelPPOCritic", "_forward_micro_batch"),
        {"torch": torch, "self": types.SimpleNamespace(device_name="cuda")}))
    return out


def _engine_configs(cfg, installed):
    """Each model's FSDP engine config, as the trainer and workers build it."""
    sections = {"actor": cfg.actor_rollout_ref.actor.fsdp_config,
                "ref": cfg.actor_rollout_ref.ref.fsdp_config, "critic": cfg.critic.fsdp}
    if not installed:
        return {role: _Section(node) for role, node in sections.items()}
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    ref = cfg.actor_rollout_ref.ref
    with open_dict(ref):  # engine_workers.ActorRolloutRefWorker.init_model, before converting
        ref.ppo_mini_batch_size = actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    # the trainer converts the whole critic section only when it builds a critic (its model
    # path must then load); the engine config it takes from it is the same dataclass
    critic = omega_conf_to_dataclass(cfg.critic).engine if cfg.algorithm.adv_estimator == "gae" \
        else omega_conf_to_dataclass(cfg.critic.fsdp)
    return {"actor": actor.engine, "ref": omega_conf_to_dataclass(ref).engine, "critic": critic}


def _engine(verl, cfg, precision, installed):
    """verl 0.8 on: every model is an FSDPEngine, its autocast the mixed-precision param
    dtype (none for float32)."""
    impl = _tree(verl, "workers/engine/fsdp/transformer_impl.py")
    out = {}
    for role, engine_config in _engine_configs(cfg, installed).items():
        self = types.SimpleNamespace(engine_config=engine_config)
        ns = {"torch": torch, "PrecisionType": precision, "self": self}
        _run(_function(impl, "FSDPEngine", "_build_module"), ns)
        _run(_function(impl, "FSDPEngine", "_build_fsdp_module"), ns)
        out[role] = _report(ns, self._autocast_dtype)
    return out


def probe(job):
    verl = job["verl"]
    with initialize_config_dir(config_dir=os.path.join(verl, "trainer", "config"),
                               version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=job["overrides"])
    precision = _precision_type(verl)
    legacy = os.path.exists(os.path.join(verl, "workers", "fsdp_workers.py")) and \
        cfg.trainer.get("use_legacy_worker_impl", "auto") != "disable"
    return _legacy(verl, cfg, precision) if legacy else \
        _engine(verl, cfg, precision, job["installed"])


def _reported(job):
    try:
        return probe(job)
    except Exception:
        return {"error": traceback.format_exc()}


print(json.dumps([_reported(job) for job in json.loads(sys.stdin.read())]))
