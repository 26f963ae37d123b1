"""Realistic adapter bugs, one per mutant, for the conformance kit's mutation suite.

Each mutant is a text edit to a copy of an adapter, its contract or the TRL plugin: the kind of
mistake a plugin author or a refactor makes (a swapped pair, a unit error, a renamed key, a
dropped pin, a collector that over-counts). The suite applies each to a copy, runs the kit on
the engine and counts it killed when the kit fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# each adapter package's modules: its vocabulary, rule table and section rules, launch, collection
VERL = "stateset_backend/adapters/verl"
VERL_DIALECT = f"{VERL}/dialect.py"
VERL_RULES = f"{VERL}/rules.py"
VERL_ALGORITHM = f"{VERL}/algorithm_rules.py"
VERL_TRAINING = f"{VERL}/training_rules.py"
VERL_RENDER = f"{VERL}/render.py"
VERL_COLLECT = f"{VERL}/collect.py"
VERL_CONTRACT = "stateset_backend/contracts/verl.json"
ORL = "stateset_backend/adapters/openrlhf"
ORL_RULES = f"{ORL}/rules.py"
ORL_ALGORITHM = f"{ORL}/algorithm_rules.py"
ORL_TRAINING = f"{ORL}/training_rules.py"
ORL_RENDER = f"{ORL}/render.py"
ORL_COLLECT = f"{ORL}/collect.py"
ORL_CONTRACT = "stateset_backend/contracts/openrlhf.json"
NEMO = "stateset_backend/adapters/nemo_rl"
NEMO_RULES = f"{NEMO}/rules.py"
NEMO_ALGORITHM = f"{NEMO}/algorithm_rules.py"
NEMO_TRAINING = f"{NEMO}/training_rules.py"
NEMO_COLLECT = f"{NEMO}/collect.py"
NEMO_CONTRACT = "stateset_backend/contracts/nemo-rl.json"
NEMO_LAUNCHER = f"{NEMO}/launcher.py"
NEMO_RENDER = f"{NEMO}/render.py"
TRL = "stateset_trl_engine/plugin.py"
TRL_LAUNCHER = "stateset_trl_engine/launch_script.py"
TRL_CONTRACT = "stateset_trl_engine/contract.json"


@dataclass(frozen=True)
class Mutant:
    name: str
    engine: str
    version: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old text, new text): every occurrence
    kind: str = "translation"
    notes: str = field(default="", compare=False)


def m(name: str, engine: str, version: str, *edits: tuple[str, str, str],
      kind: str = "translation") -> Mutant:
    return Mutant(name, engine, version, tuple(edits), kind)


MUTANTS: list[Mutant] = [
    # -- verl -------------------------------------------------------------------------------------
    m("verl: clip low and high swapped", "verl", "0.9.1",
      (VERL_RULES, '"algorithm.clip.low": to(f"{ACTOR}.clip_ratio_low")',
       '"algorithm.clip.low": to(f"{ACTOR}.clip_ratio_high")'),
      (VERL_RULES, '"algorithm.clip.high": to(f"{ACTOR}.clip_ratio_high")',
       '"algorithm.clip.high": to(f"{ACTOR}.clip_ratio_low")')),
    m("verl: k1 and k3 swapped", "verl", "0.9.1",
      (VERL_DIALECT, 'KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}',
       'KL_TYPE = {"k1": "low_var_kl", "k2": "mse", "k3": "kl"}')),
    m("verl: mini-batch counted in responses", "verl", "0.9.1",
      (VERL_TRAINING, 'Pinned({f"{ACTOR}.ppo_mini_batch_size": prompts // value},',
       'Pinned({f"{ACTOR}.ppo_mini_batch_size": prompts * spec.algorithm.group_size // value},')),
    m("verl: max response length is prompt + response", "verl", "0.9.1",
      (VERL_RULES, '"data.max_response_tokens": to("data.max_response_length")',
       '"data.max_response_tokens": lambda v, s: Pinned({"data.max_response_length": '
       'v + s.data.max_prompt_tokens})')),
    m("verl: rloo launched as grpo", "verl", "0.9.1",
      (VERL_DIALECT, '"rloo": "rloo",', '"rloo": "grpo",')),
    m("verl: group size on the validation sampler", "verl", "0.9.1",
      (VERL_RULES, '"algorithm.group_size": to(f"{ROLLOUT}.n")',
       '"algorithm.group_size": to(f"{VAL}.n")')),
    m("verl: learning rate pinned to a constant", "verl", "0.9.1",
      (VERL_RULES, '"optim.lr": to(k(f"{ACTOR}.optim.lr"))',
       '"optim.lr": lambda v, s: Pinned({k(f"{ACTOR}.optim.lr"): 1e-6})')),
    m("verl: temperature key misspelt", "verl", "0.9.1",
      (VERL_RULES, '"rollout.temperature": to(f"{ROLLOUT}.temperature")',
       '"rollout.temperature": to(f"{ROLLOUT}.temprature")')),
    m("verl: entropy key of another spelling", "verl", "0.9.1",
      (VERL_RULES, 'to(f"{ACTOR}.entropy_coeff")', 'to(f"{ACTOR}.entropy_coef")')),
    m("verl: seq-mean-token-mean mapped to token-mean", "verl", "0.9.1",
      (VERL_DIALECT, '"seq_mean_token_mean": "seq-mean-token-mean",',
       '"seq_mean_token_mean": "token-mean",')),
    m("verl: gradient clipping dropped", "verl", "0.9.1",
      (VERL_RULES, '"optim.grad_clip": to(*keys.grad_clip, *keys.critic_grad_clip)',
       '"optim.grad_clip": carried("verl clips gradients")')),
    m("verl: train batch counted in responses", "verl", "0.9.1",
      (VERL_RULES, '"budget.prompts_per_update": to("data.train_batch_size")',
       '"budget.prompts_per_update": lambda v, s: Pinned({"data.train_batch_size": '
       'v * s.algorithm.group_size})')),
    m("verl: ppo epochs key misspelt", "verl", "0.9.1",
      (VERL_RULES, 'to(f"{ACTOR}.ppo_epochs")', 'to(f"{ACTOR}.ppo_epoch")')),
    m("verl: interpolations carried with one escape", "verl", "0.9.1",
      (VERL_RENDER, '    overrides.refuse_interpolations(native, translation.sources, "verl", '
                    'READ_PATH)\n', '')),
    m("verl: KL coefficient on the unused placement", "verl", "0.9.1",
      (VERL_ALGORITHM,
       'key = f"{ACTOR}.kl_loss_coef" if _in_loss(spec) else "algorithm.kl_ctrl.kl_coef"',
       'key = "algorithm.kl_ctrl.kl_coef" if _in_loss(spec) else f"{ACTOR}.kl_loss_coef"')),
    m("verl: reward metric read under another name", "verl", "0.9.1",
      (VERL_COLLECT, '"reward/mean": "critic/score/mean"', '"reward/mean": "critic/rewards/mean"'),
      kind="collection"),
    m("verl: committed updates counted as log rows", "verl", "0.9.1",
      (VERL_COLLECT,
       'out.committed_updates = max(steps, default=0)',
       'out.committed_updates = len(out.metrics)'), kind="collection"),
    m("verl: weight decay pinned to the default", "verl", "0.9.1",
      (VERL_RULES, '"optim.weight_decay": k.optim_rule("weight_decay")',
       '"optim.weight_decay": lambda v, s: Pinned(k.optim("weight_decay", 0.01))')),
    m("verl: top_p on the validation sampler", "verl", "0.9.1",
      (VERL_RULES, '"rollout.top_p": to(f"{ROLLOUT}.top_p")',
       '"rollout.top_p": to(f"{VAL}.top_p")')),
    m("verl: prompt limit carried as the response limit", "verl", "0.9.1",
      (VERL_RULES, '"data.max_prompt_tokens": to("data.max_prompt_length")',
       '"data.max_prompt_tokens": to("data.max_prompt_length", "data.max_response_length")')),
    m("verl: recorded dual-clip default changed", "verl", "0.9.1",
      (VERL_CONTRACT, '"actor_rollout_ref.actor.clip_ratio_c": 3.0',
       '"actor_rollout_ref.actor.clip_ratio_c": 10.0'), kind="contract"),
    m("verl: a recorded default under a misspelt key", "verl", "0.9.1",
      (VERL_CONTRACT, '"actor_rollout_ref.actor.clip_ratio_c": 3.0',
       '"actor_rollout_ref.actor.clip_ratio_cc": 3.0'), kind="contract"),
    m("verl: ppo epochs pinned at 1", "verl", "0.9.1",
      (VERL_RULES, 'to(f"{ACTOR}.ppo_epochs")', 'to(f"{ACTOR}.ppo_epochs", convert=lambda v: 1)')),
    m("verl: reward shim swaps response and answer", "verl", "0.9.1",
      (VERL_RENDER, "return float(score(prompt, solution_str, ground_truth))",
       "return float(score(prompt, ground_truth, solution_str))"), kind="launcher"),
    m("verl: launches another entry module", "verl", "0.9.1",
      (VERL_RENDER, '"-m", "verl.trainer.main_ppo"', '"-m", "verl.trainer.main"'), kind="launcher"),
    m("verl: reward function named by the user's name", "verl", "0.9.1",
      (VERL_RULES, 'f"{fn}.name": "compute_score"', 'f"{fn}.name": "score"'), kind="launcher"),
    m("verl: k3 clamp deviation never returned", "verl", "0.9.1",
      (VERL_ALGORITHM, 'return Hardcoded(K3_CLAMP, "k3_clamp")', "return Pinned({})"),
      kind="deviation"),
    m("verl: refill deviation renamed in the contract", "verl", "0.9.1",
      (VERL_CONTRACT, '"unbounded_refill": {', '"unbounded_refills": {'), kind="contract"),
    m("verl: the model's config overrides left open to engine options", "verl", "0.9.1",
      (VERL_CONTRACT, '          "actor_rollout_ref.model.override_config",\n', ""),
      (VERL_CONTRACT, '        "actor_rollout_ref.model.override_config": {},\n', ""),
      kind="contract"),
    # -- OpenRLHF ---------------------------------------------------------------------------------
    m("openrlhf: clip pair swapped", "openrlhf", "0.11.2",
      (ORL_ALGORITHM,
       'Pinned({f.eps_clip_low_high: [spec.algorithm.clip.low, spec.algorithm.clip.high]})',
       'Pinned({f.eps_clip_low_high: [spec.algorithm.clip.high, spec.algorithm.clip.low]})')),
    m("openrlhf: rollout correction mask taken for the sequence mask", "openrlhf", "0.10.2",
      (ORL_ALGORITHM, '"mask": "icepop"', '"mask": "seq-mask-tis"')),
    m("openrlhf: train batch counted in prompts", "openrlhf", "0.11.2",
      (ORL_TRAINING, 'Pinned({f.train_batch_size: samples // value})',
       'Pinned({f.train_batch_size: spec.budget.prompts_per_update // value})')),
    m("openrlhf: group size key of the flat dialect", "openrlhf", "0.11.2",
      (ORL_CONTRACT, '"group_size": "--rollout.n_samples_per_prompt"',
       '"group_size": "--n_samples_per_prompt"'), kind="contract"),
    m("openrlhf: learning rate pinned to a constant", "openrlhf", "0.11.2",
      (ORL_TRAINING, '"optim.lr": lambda v, s: Pinned({f.lr[0]: v})',
       '"optim.lr": lambda v, s: Pinned({f.lr[0]: 1e-6})')),
    m("openrlhf: gradient clip pinned to 1.0", "openrlhf", "0.11.2",
      (ORL_TRAINING, '"optim.grad_clip": lambda v, s: Pinned({k: v for k in f.max_norm})',
       '"optim.grad_clip": lambda v, s: Pinned({k: 1.0 for k in f.max_norm})')),
    m("openrlhf: temperature from the validation decoding", "openrlhf", "0.11.2",
      (ORL_RULES, '"rollout.temperature": to(f.temperature)',
       '"rollout.temperature": lambda v, s: Pinned({f.temperature: s.evaluation.temperature})')),
    m("openrlhf: weight decay dropped", "openrlhf", "0.11.2",
      (ORL_TRAINING, 'native = {k: value for k in f.weight_decay}',
       'native = {k: 0.0 for k in f.weight_decay}')),
    m("openrlhf: rollout batch counted in samples", "openrlhf", "0.11.2",
      (ORL_RULES, '"budget.prompts_per_update": to(f.rollout_batch_size, f.generate_batch_size)',
       '"budget.prompts_per_update": lambda v, s: Pinned({f.rollout_batch_size: '
       'v * s.algorithm.group_size, f.generate_batch_size: v})')),
    m("openrlhf: reward metric read under another name", "openrlhf", "0.11.2",
      (ORL_COLLECT, '"reward/mean": "train/reward"', '"reward/mean": "train/rewards"'),
      kind="collection"),
    m("openrlhf: a recorded default changed", "openrlhf", "0.9.8",
      (ORL_CONTRACT, '"--l2": 0.0,', '"--l2": 0.01,'), kind="contract"),
    m("openrlhf: top_p dropped", "openrlhf", "0.11.2",
      (ORL_RULES, '"rollout.top_p": to(f.top_p)', '"rollout.top_p": carried("vLLM top_p")')),
    m("openrlhf: KL estimator always k3", "openrlhf", "0.11.2",
      (ORL_ALGORITHM, '"algorithm.kl.estimator": to(f.kl_estimator)',
       '"algorithm.kl.estimator": to(f.kl_estimator, convert=lambda v: "k3")')),
    m("openrlhf: store_true flag given a value", "openrlhf", "0.11.2",
      (ORL_RENDER, '        if value is True:\n            argv.append(flag)',
       '        if value is True:\n            argv.append(f"{flag}=true")')),
    m("openrlhf: reward shim swaps response and answer", "openrlhf", "0.11.2",
      (ORL_RENDER, "score(p, q[len(p):], a)", "score(p, a, q[len(p):])"), kind="launcher"),
    m("openrlhf: launches another entry module", "openrlhf", "0.11.2",
      (ORL_RENDER, '"openrlhf.cli.train_ppo_ray"', '"openrlhf.cli.train_ppo"'), kind="launcher"),
    m("openrlhf: warmup deviation never returned", "openrlhf", "0.11.2",
      (ORL_TRAINING, 'return Hardcoded("warmup over warmup_steps * k optimizer steps",\n'
                     '                             "lr_warmup_per_optimizer_step", native)',
       "return Pinned(native)"), kind="deviation"),
    m("openrlhf: dynamic batching allowed at any ZeRO stage", "openrlhf", "0.11.2",
      (ORL_CONTRACT, '"requires": {\n              "--ds.zero_stage": [\n'
                     '                3\n              ]',
       '"requires": {\n              "--ds.zero_stage": [\n                1,\n'
       '                2,\n                3\n              ]'),
      kind="contract"),
    # -- NeMo RL ----------------------------------------------------------------------------------
    m("nemo-rl: clip min and max swapped", "nemo-rl", "0.7.0",
      (NEMO_RULES, '"algorithm.clip.low": to("loss_fn.ratio_clip_min")',
       '"algorithm.clip.low": to("loss_fn.ratio_clip_max")'),
      (NEMO_RULES, '"algorithm.clip.high": to("loss_fn.ratio_clip_max")',
       '"algorithm.clip.high": to("loss_fn.ratio_clip_min")')),
    m("nemo-rl: group size on the wrong key", "nemo-rl", "0.7.0",
      (NEMO_RULES, '"algorithm.group_size": to("grpo.num_generations_per_prompt")',
       '"algorithm.group_size": to("grpo.num_prompts_per_step")')),
    m("nemo-rl: a shared budget left at the two limits' sum", "nemo-rl", "0.7.0",
      (NEMO_TRAINING, "total = data.max_total_tokens or data.max_prompt_tokens",
       "total = data.max_prompt_tokens")),
    m("nemo-rl: warmup start left at the stand-in for 0", "nemo-rl", "0.7.0",
      (NEMO_TRAINING, '"start_factor": o.warmup_start_ratio or WARMUP_START',
       '"start_factor": WARMUP_START')),
    m("nemo-rl: a mapping option written as a plain override", "nemo-rl", "0.7.0",
      (NEMO_RENDER, "*overrides.render(overrides.force_add_mappings(\n"
                    "                  native, translation.sources, \"nemo-rl\"))],",
       "*overrides.render(native)],")),
    m("nemo-rl: learning rate pinned to a constant", "nemo-rl", "0.7.0",
      (NEMO_TRAINING, '"optim.lr": to("policy.optimizer.kwargs.lr")',
       '"optim.lr": lambda v, s: Pinned({"policy.optimizer.kwargs.lr": 5e-06})')),
    m("nemo-rl: temperature key misspelt", "nemo-rl", "0.7.0",
      (NEMO_RULES, '"rollout.temperature": to("policy.generation.temperature")',
       '"rollout.temperature": to("policy.generation.temprature")')),
    m("nemo-rl: reward metric read under another name", "nemo-rl", "0.7.0",
      (NEMO_COLLECT, '"reward/mean": "train/reward"', '"reward/mean": "train/rewards"'),
      kind="collection"),
    m("nemo-rl: committed updates off by one", "nemo-rl", "0.7.0",
      (NEMO_COLLECT, 'out.committed_updates = max(trained, default=0)',
       'out.committed_updates = 1 + max(trained, default=0)'),
      kind="collection"),
    m("nemo-rl: a recorded default changed", "nemo-rl", "0.7.0",
      (NEMO_CONTRACT, '"loss_fn.ratio_clip_min": 0.2', '"loss_fn.ratio_clip_min": 0.3'),
      kind="contract"),
    m("nemo-rl: launcher scores against the prompt", "nemo-rl", "0.7.0",
      (NEMO_LAUNCHER, '"ground_truth": assistant["content"]},',
       '"ground_truth": prompt_text(messages)},'), kind="launcher"),
    m("nemo-rl: launcher drops the overrides", "nemo-rl", "0.7.0",
      (NEMO_LAUNCHER, "sys.argv = [script, *rest]", "sys.argv = [script, *rest[:2]]"),
      kind="launcher"),
    m("nemo-rl: leave-one-out std deviation never returned", "nemo-rl", "0.7.0",
      (NEMO_ALGORITHM, 'return Hardcoded("leave-one-out std", "rloo_leave_one_out_std")',
       'return Pinned({}, "")'), kind="deviation"),
    # -- what an adapter says about a release, held to the release's code -------------------------
    m("verl: GSPO claimed a release before verl has its loss", "verl", "0.5.0",
      (VERL_CONTRACT, '"versions": ">=0.6",', '"versions": ">=0.5",'), kind="contract"),
    m("verl: k3 clamp stated as the log-ratio's", "verl", "0.9.1",
      (VERL_CONTRACT, '"engine_value": 10.0,', '"engine_value": 20.0,'), kind="contract"),
    m("openrlhf: group std epsilon stated as 1e-6", "openrlhf", "0.11.2",
      (ORL_CONTRACT, '"engine_value": 1e-09,', '"engine_value": 1e-06,'), kind="contract"),
    m("trl: NEFTune left at TRL's default", "trl", "1.16.0",
      (TRL_CONTRACT, '"router_aux_loss_coef": null,\n          "neftune_noise_alpha": null\n',
       '"router_aux_loss_coef": null\n'),
      (TRL_CONTRACT, '"learning_rate": 1e-06,\n        "neftune_noise_alpha": null,\n',
       '"learning_rate": 1e-06,\n'), kind="contract"),
    m("trl: updates counted in optimizer steps", "trl", "1.16.0",
      (TRL, 'canonical = rows.setdefault(int(row["update"]), {"step": int(row["update"])})',
       'canonical = rows.setdefault(int(row["step"]), {"step": int(row["step"])})'),
      (TRL, 'trained.add(int(row["update"]))', 'trained.add(int(row["step"]))'),
      kind="collection"),
    # -- TRL plugin -------------------------------------------------------------------------------
    m("trl: clip pair swapped", "trl", "1.16.0",
      (TRL, '        return Pinned({f.epsilon: value})\n',
       '        return Pinned({SWAP: value})\n'),
      (TRL, '        return Pinned({f.epsilon_high: value})\n',
       '        return Pinned({f.epsilon: value})\n'),
      (TRL, '        return Pinned({SWAP: value})\n',
       '        return Pinned({f.epsilon_high: value})\n')),
    m("trl: group size pinned to a constant", "trl", "1.16.0",
      (TRL, 'to(f.num_generations)', 'to(f.num_generations, convert=lambda v: 8)')),
    m("trl: learning rate key of another spelling", "trl", "1.16.0",
      (TRL_CONTRACT, '"learning_rate": "learning_rate",', '"learning_rate": "lr",'),
      kind="contract"),
    m("trl: temperature dropped", "trl", "1.16.0",
      (TRL, '"rollout.temperature": to(f.temperature)',
       '"rollout.temperature": carried("TRL samples at its temperature")')),
    m("trl: ppo epochs pinned at 1", "trl", "1.16.0",
      (TRL, '"budget.ppo_epochs": to(f.num_iterations)',
       '"budget.ppo_epochs": to(f.num_iterations, convert=lambda v: 1)')),
    m("trl: reward metric read under another name", "trl", "1.16.0",
      (TRL, '"reward/mean": "reward"', '"reward/mean": "rewards"'), kind="collection"),
    m("trl: a recorded default changed", "trl", "1.16.0",
      (TRL_CONTRACT, '"epsilon": 0.2,', '"epsilon": 0.3,'), kind="contract"),
    m("trl: launcher drops a config key", "trl", "1.16.0",
      (TRL_LAUNCHER, 'config = dict(SETTINGS["config"])',
       'config = {k: v for k, v in SETTINGS["config"].items() if k != "beta"}'),
      kind="launcher"),
    m("trl: reward shim scores against the prompt", "trl", "1.16.0",
      (TRL, "score(p, text(c), a)", "score(p, text(c), p)"), kind="launcher"),
    m("trl: committed updates off by one", "trl", "1.16.0",
      (TRL, "out.committed_updates = max(trained, default=out.resumed_from or 0)",
       "out.committed_updates = max(trained, default=out.resumed_from or 0) + 1"),
      kind="collection"),
    m("trl: resume forgets the checkpoint", "trl", "1.16.0",
      (TRL, 'return [*argv, "--resume-from", str(checkpoint.path)]', "return list(argv)"),
      kind="resume"),
    # -- resume and collection, every engine ---------------------------------------------------
    m("verl: a resume launched with resume disabled", "verl", "0.9.1",
      (VERL_COLLECT, '"trainer.resume_mode=resume_path",', '"trainer.resume_mode=disable",'),
      kind="resume"),
    m("openrlhf: a resume staged without the load flag", "openrlhf", "0.11.2",
      (ORL_COLLECT, "return [*argv, load_flag]", "return [*argv]"), kind="resume"),
    m("verl: the resume point read one update late", "verl", "0.9.1",
      ("stateset_backend/adapters/verl/collect.py",
       "out.resumed_from = resumed_from_steps(steps)",
       "out.resumed_from = max(steps, default=0) or None"), kind="collection"),
    m("openrlhf: a resumed attempt reported as a fresh start", "openrlhf", "0.11.2",
      (ORL_COLLECT, "out.resumed_from = resumed_from_steps(trained)", "out.resumed_from = None"),
      kind="collection"),
    m("nemo-rl: one checkpoint more kept", "nemo-rl", "0.7.0",
      (f"{NEMO}/training_rules.py", 'Pinned({"checkpointing.keep_top_k": v,',
       'Pinned({"checkpointing.keep_top_k": v and v + 1,')),
    m("verl: a NaN metric dropped on collection", "verl", "0.9.1",
      (VERL_COLLECT, 'for c, r in names.items() if r in doc["data"]}',
       'for c, r in names.items() if r in doc["data"] and doc["data"][r] == doc["data"][r]}'),
      kind="collection"),
    m("verl: the oldest checkpoint offered for a resume", "verl", "0.9.1",
      (VERL_COLLECT, "    return found[-1] if found else None",
       "    return found[0] if found else None"), kind="resume"),
    m("openrlhf: a resume stages an empty checkpoint folder", "openrlhf", "0.11.2",
      (ORL_COLLECT,
       "stage_checkpoint(root / role / tag, attempt_dir / CHECKPOINTS / role / tag)",
       "(attempt_dir / CHECKPOINTS / role / tag).mkdir(parents=True, exist_ok=True)"),
      kind="resume"),
    m("nemo-rl: a resume stages the checkpoint without its weights", "nemo-rl", "0.7.0",
      (NEMO_COLLECT,
       "stage_checkpoint(checkpoint.path, attempt_dir / CHECKPOINTS / checkpoint.path.name)",
       "stage_checkpoint(checkpoint.path, attempt_dir / CHECKPOINTS / checkpoint.path.name); "
       "__import__('shutil').rmtree(attempt_dir / CHECKPOINTS / checkpoint.path.name / "
       "'policy')"), kind="resume"),
    m("openrlhf: the resume point read off the staged checkpoint", "openrlhf", "0.11.2",
      (ORL_COLLECT, "out.resumed_from = resumed_from_steps(trained)",
       "out.resumed_from = min((int(p.name.removeprefix('global_step')) for p in "
       "(attempt_dir / CHECKPOINTS / '_actor').glob('global_step*')), default=None)"),
      kind="collection"),
    # -- settings no sample turned on, limits that were equal, values nobody read back -----------
    m("verl: top_k never passed to the rollout", "verl", "0.9.1",
      (VERL_TRAINING, 'return Pinned({f"{ROLLOUT}.top_k": -1 if value is None else value})',
       'return Pinned({f"{ROLLOUT}.top_k": -1})')),
    m("verl: a spec's dual clip replaced by no dual clip", "verl", "0.9.1",
      (VERL_ALGORITHM,
       "\"binds (verl's default 3.0 would dual-clip)\")\n    return Pinned({key: value})",
       "\"binds (verl's default 3.0 would dual-clip)\")\n    return Pinned({key: NO_DUAL_CLIP})")),
    m("verl: validation always greedy", "verl", "0.9.1",
      (VERL_TRAINING, 'f"{VAL}.do_sample": value > 0,', 'f"{VAL}.do_sample": False,')),
    m("verl: overlong buffer measured against the prompt limit", "verl", "0.9.1",
      (VERL_ALGORITHM, 'f"{kw}.max_resp_len": spec.data.max_response_tokens',
       'f"{kw}.max_resp_len": spec.data.max_prompt_tokens')),
    m("openrlhf: cosine floor dropped", "openrlhf", "0.11.2",
      (ORL_TRAINING, "return Pinned({k: value for k in f.min_lr_ratio})",
       "return Pinned({k: 0.0 for k in f.min_lr_ratio})")),
    m("nemo-rl: cosine floor given as an absolute learning rate", "nemo-rl", "0.7.0",
      (NEMO_TRAINING, '"eta_min": o.min_lr_ratio * o.lr', '"eta_min": o.min_lr_ratio')),
    m("trl: top_k never passed", "trl", "1.16.0",
      (TRL, "to(f.top_k, convert=lambda v: 0 if v is None else v)",
       "to(f.top_k, convert=lambda v: 0)")),
    m("verl: policy loss read from the clip fraction", "verl", "0.9.1",
      (VERL_COLLECT, '"loss/policy": "actor/pg_loss"', '"loss/policy": "actor/pg_clipfrac"'),
      kind="collection"),
    m("openrlhf: KL read under another name", "openrlhf", "0.11.2",
      (ORL_COLLECT, '"kl": "train/kl"', '"kl": "train/kl_loss"'), kind="collection"),
    m("verl: checkpoint files labelled one update early", "verl", "0.9.1",
      (VERL_COLLECT, "out.artifacts += checkpoint_artifacts(attempt_dir, step_dir, step)",
       "out.artifacts += checkpoint_artifacts(attempt_dir, step_dir, step - 1)"),
      kind="collection"),
]
