# ruff: noqa: F821
# The fixed part of the generated launch (stateset-trl-engine prepends SETTINGS): build the
# spec's model, data and reward, run GRPOTrainer for exactly max_steps optimizer steps, and
# leave the identity, one metrics line per update, checkpoints and the final model in the run
# folder. Every value comes from SETTINGS; nothing here is formatted from user text.
import os
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent


def read_rows(path):
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as fh:
        if path.endswith(".json"):
            return json.load(fh)
        return [json.loads(line) for line in fh if line.strip()]


def load_tokenizer(launch):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(launch["model"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def initial_model(launch, tokenizer, seed):
    """The policy TRL starts from: a path. A built-in model is its architecture initialised
    from the spec's seed (as the native engine does), saved so the reference is the same."""
    if not launch["init_from_seed"]:
        return launch["model"]
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(launch["model"], local_files_only=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target = RUN / "initial_model"
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


def prompt_rows(launch, tokenizer):
    rows, kept = read_rows(launch["train_uri"]), []
    limit, chat = launch["max_prompt_tokens"], launch["chat_template"]
    for index, row in enumerate(rows):
        text = row[launch["prompt_field"]]
        answer = row.get(launch["answer_field"], "") if launch["answer_field"] else ""
        prompt = [{"role": "user", "content": text}] if chat else text
        if chat:
            length = len(tokenizer.apply_chat_template(prompt, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))
        else:
            length = len(tokenizer(text)["input_ids"])
        if length > limit:
            if launch["prompt_overflow"] == "error":
                raise SystemExit(f"data.train row {index}: prompt has {length} tokens, over "
                                 f"data.max_prompt_tokens {limit}")
            continue
        kept.append({"prompt": prompt, "stateset_prompt": text, "stateset_answer": answer})
    print(f"stateset-trl: {len(kept)} of {len(rows)} prompts within {limit} tokens", flush=True)
    return kept


def main():
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(RUN))
    import stateset_reward

    launch, files, k = SETTINGS["launch"], SETTINGS["files"], SETTINGS["steps_per_update"]
    config = dict(SETTINGS["config"])
    config["output_dir"] = str(RUN / config["output_dir"])
    args = GRPOConfig(**config)
    # the identity as TRL carries it (its run name), written before anything can fail
    identity = {"run_name": args.run_name, "steps_per_update": k}
    (RUN / files["identity"]).write_text(json.dumps(identity) + "\n", encoding="utf-8")

    tokenizer = load_tokenizer(launch)
    model = initial_model(launch, tokenizer, SETTINGS["seed"])
    dataset = Dataset.from_list(prompt_rows(launch, tokenizer))
    metrics = open(RUN / files["metrics"], "a", encoding="utf-8")  # noqa: SIM115

    class UpdateMetrics(TrainerCallback):
        """One line per update: TRL logs every k optimizer steps (logging_steps)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs and state.global_step % k == 0:
                metrics.write(json.dumps({"update": state.global_step // k,
                                          "step": state.global_step, "logs": logs}) + "\n")
                metrics.flush()
                os.fsync(metrics.fileno())

    trainer = GRPOTrainer(model=model, reward_funcs=[stateset_reward.trl_reward], args=args,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[UpdateMetrics()])
    trainer.train()
    metrics.close()
    if trainer.state.global_step != args.max_steps:
        raise SystemExit(f"TRL stopped after {trainer.state.global_step} of {args.max_steps} "
                         "optimizer steps")
    trainer.save_model(str(RUN / files["final"]))


main()
