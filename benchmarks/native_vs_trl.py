"""Native engine vs TRL's GRPOTrainer on the CPU, side by side, in one run.

Both train the same built-in 2-layer Llama (same config, tokenizer and init seed) on the same
support-routing prompts with the same reward, group size, prompts per update, completion
length, learning rate, KL and number of updates. Each engine runs in its own process so peak
memory is its own. Reported: updates per second (training loop only, model load excluded),
the ratio, peak RSS, the mean training reward over the last 20 updates, and the held-out
validation reward of the trained policy under one shared greedy evaluation.

    pip install trl
    python benchmarks/native_vs_trl.py [--updates 200] [--out benchmarks/results/native_vs_trl.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SPEC = EXAMPLES / "support-routing.json"


def _spec(updates: int) -> dict[str, Any]:
    doc = json.loads(SPEC.read_text())
    doc["budget"]["total_updates"] = updates
    doc["checkpoint"] = {"every": None, "keep": None}
    doc["evaluation"] = {"every": None, "select_by": None}
    doc["optim"]["warmup_steps"] = 0  # TRL's linear-to-zero schedule is turned off too
    return doc


def _evaluate(model: Any, tokenizer: Any, rows: list[Any], reward: Any,
              max_new_tokens: int) -> float:
    """Greedy held-out reward, with the same code for both engines."""
    import torch

    from stateset_backend.native.rollout import sample

    scores = []
    for start in range(0, len(rows), 64):
        chunk = rows[start:start + 64]
        enc = tokenizer([r.prompt for r in chunk], padding=True, padding_side="left",
                        return_tensors="pt")
        ids, mask, _ = sample(model, enc["input_ids"], enc["attention_mask"].float(),
                              max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0,
                              eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                              generator=None, greedy=True)
        texts = tokenizer.batch_decode(torch.where(mask.bool(), ids, tokenizer.pad_token_id),
                                       skip_special_tokens=True)
        scores += [reward(r.prompt, t, r.answer) for r, t in zip(chunk, texts, strict=True)]
    return sum(scores) / len(scores)


def run_native(updates: int) -> dict[str, Any]:
    from stateset_backend.native.data import load_split
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(_spec(updates))
    out = ROOT / "benchmarks" / "results" / "native-run"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    trainer = Trainer(RunSettings("bench", experiment_digest(spec), spec, EXAMPLES), out)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    rows = [json.loads(x) for x in trainer.out.metrics.read_text().splitlines()]
    val = load_split(spec.data.validation, EXAMPLES) if spec.data.validation else []
    return {"seconds": seconds, "train_rewards": [r["reward/mean"] for r in rows],
            "val_reward": _evaluate(trainer.model, trainer.tokenizer, val, trainer.reward_fn,
                                    spec.data.max_response_tokens)}


def run_trl(updates: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from stateset_backend.native.data import load_split
    from stateset_backend.native.model import load_policy
    from stateset_backend.native.reward import load_reward
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(_spec(updates))
    model, tokenizer = load_policy(spec.model, spec.seed, EXAMPLES, torch.device("cpu"))
    reward = load_reward(spec.reward, EXAMPLES)
    train = load_split(spec.data.train, EXAMPLES)
    val = load_split(spec.data.validation, EXAMPLES) if spec.data.validation else []
    dataset = Dataset.from_list([{"prompt": r.prompt, "answer": r.answer} for r in train])

    def reward_fn(prompts: list[str], completions: list[str], answer: list[str],
                  **_: Any) -> list[float]:
        return [reward(p, c, a) for p, c, a in zip(prompts, completions, answer, strict=True)]

    alg, budget = spec.algorithm, spec.budget
    samples = budget.prompts_per_update * alg.group_size
    assert alg.kl is not None
    config = GRPOConfig(
        output_dir=str(ROOT / "benchmarks" / "results" / "trl-run"), use_cpu=True,
        per_device_train_batch_size=samples, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=alg.group_size, num_iterations=1,
        max_completion_length=spec.data.max_response_tokens, max_steps=updates,
        learning_rate=spec.optim.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=spec.optim.weight_decay, max_grad_norm=spec.optim.grad_clip,
        beta=alg.kl.coef, epsilon=alg.clip.low, epsilon_high=alg.clip.high,
        loss_type="grpo", scale_rewards="group", temperature=spec.rollout.temperature,
        top_p=spec.rollout.top_p, seed=spec.seed, logging_steps=1, save_strategy="no",
        report_to="none", bf16=False, fp16=False, disable_tqdm=True,
        dataloader_num_workers=0)
    rewards: list[float] = []

    class Collect(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
                   **kw: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    # TRL builds its reference model from a path, so hand it the same seed-initialised
    # weights the native engine starts from, saved to disk.
    init_dir = ROOT / "benchmarks" / "results" / "init-model"
    model.save_pretrained(init_dir)
    tokenizer.save_pretrained(init_dir)
    trainer = GRPOTrainer(model=str(init_dir), reward_funcs=[reward_fn], args=config,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[Collect()])
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "train_rewards": rewards,
            "val_reward": _evaluate(trainer.model, tokenizer, val, reward,
                                    spec.data.max_response_tokens)}


def child(engine: str, updates: int) -> None:
    result = (run_native if engine == "native" else run_trl)(updates)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["updates"] = updates
    print("RESULT=" + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--engine", choices=["native", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "native_vs_trl.json")
    args = parser.parse_args()
    if args.engine:
        child(args.engine, args.updates)
        return
    results = {}
    for engine in ("native", "trl"):
        proc = subprocess.run([sys.executable, __file__, "--engine", engine, "--updates",
                               str(args.updates)], capture_output=True, text=True)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT=")]
        if proc.returncode != 0 or not lines:
            sys.exit(f"{engine} failed:\n{proc.stderr[-3000:]}")
        results[engine] = json.loads(lines[-1][len("RESULT="):])
    summary = {}
    for engine, r in results.items():
        tail = r["train_rewards"][-20:]
        summary[engine] = {
            "updates_per_second": round(r["updates"] / r["seconds"], 3),
            "seconds": round(r["seconds"], 1),
            "peak_rss_mib": round(r["peak_rss_mib"], 1),
            "train_reward_last20": round(sum(tail) / len(tail), 3),
            "val_reward_greedy": round(r["val_reward"], 3)}
    ratio = summary["native"]["updates_per_second"] / summary["trl"]["updates_per_second"]
    report = {"updates": args.updates, "engines": summary,
              "throughput_ratio_native_over_trl": round(ratio, 2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'engine':8} {'upd/s':>8} {'seconds':>8} {'peak MiB':>9} {'reward@20':>10} "
          f"{'val':>6}")
    for engine, s in summary.items():
        print(f"{engine:8} {s['updates_per_second']:8.3f} {s['seconds']:8.1f} "
              f"{s['peak_rss_mib']:9.1f} {s['train_reward_last20']:10.3f} "
              f"{s['val_reward_greedy']:6.3f}")
    print(f"native / TRL throughput: {ratio:.2f}x")


if __name__ == "__main__":
    main()
