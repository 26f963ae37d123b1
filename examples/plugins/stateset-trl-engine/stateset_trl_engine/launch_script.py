# ruff: noqa: F821
# The fixed part of the generated launch (stateset-trl-engine prepends SETTINGS): build the
# spec's model, data and reward, run GRPOTrainer (RL objectives) or SFTTrainer (objective sft)
# for exactly max_steps optimizer steps, and leave the identity, one metrics line per update,
# checkpoints and the final model in the run folder. Every value comes from SETTINGS; nothing
# here is formatted from user text. With `--resume-from CHECKPOINT` (an earlier attempt's) it
# continues that run exactly: TRL and transformers reload weights, optimizer, scheduler, RNG
# and global step from it, and the launch replays the data order up to it.
import hashlib
import math
import os
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent


def resume_point():
    """The checkpoint folder named by ``--resume-from``, or None for a fresh start."""
    argv = sys.argv[1:]
    if not argv:
        return None
    if len(argv) != 2 or argv[0] != "--resume-from":
        raise SystemExit(f"usage: {sys.argv[0]} [--resume-from CHECKPOINT]")
    return Path(argv[1]).resolve()


def sha256_synced(path):
    """The file's sha256, after flushing it to disk (TRL does not fsync what it saves)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
        os.fsync(fh.fileno())
    return digest.hexdigest()


def write_synced(path, doc):
    """``doc`` as JSON at ``path``, complete or not at all."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)


def runtime_identity():
    """What a checkpoint records of how it was computed, for the hub to compare on resume:
    world size and model from the plan, the version of each package that computes the run."""
    from importlib import metadata

    doc = json.loads(json.dumps(SETTINGS["runtime"]))
    for name in doc["versions"]:
        try:
            doc["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            doc["versions"][name] = None
    return doc


def seal(folder, update, best):
    """Make a checkpoint TRL has just written complete for the hub: the runtime it was
    computed under, the retention state (``best``), and last the manifest with every file's
    sha256 and the experiment digest. A folder without the manifest is not a checkpoint."""
    files = SETTINGS["files"]
    write_synced(folder / files["runtime"], runtime_identity())
    write_synced(folder / files["checkpoint_state"], {"update": update, "best": best})
    listed = {p.relative_to(folder).as_posix(): sha256_synced(p)
              for p in sorted(folder.rglob("*")) if p.is_file() and p.name != files["manifest"]}
    write_synced(folder / files["manifest"], {
        "experiment_digest": SETTINGS["experiment_digest"], "update": update, "files": listed})
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def resumed_state(checkpoint):
    """The sealed state of the checkpoint a resume continues from: its update and the best
    validated checkpoint retention had kept up to it."""
    files = SETTINGS["files"]
    manifest = checkpoint / files["manifest"]
    if not manifest.is_file():
        raise SystemExit(f"--resume-from {checkpoint}: no {files['manifest']}, not a complete "
                         "checkpoint")
    if json.loads(manifest.read_text(encoding="utf-8")).get("experiment_digest") != \
            SETTINGS["experiment_digest"]:
        raise SystemExit(f"--resume-from {checkpoint}: a checkpoint of another experiment")
    return json.loads((checkpoint / files["checkpoint_state"]).read_text(encoding="utf-8"))


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
    from the spec's seed (as the native engine does); with model.from_run, the staged
    checkpoint's weights are loaded into it. Either is saved so the reference is the same."""
    staged = launch.get("from_run_sha256")
    if not launch["init_from_seed"] and staged is None:
        return launch["model"]
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if launch["init_from_seed"]:
        config = AutoConfig.from_pretrained(launch["model"], local_files_only=True)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(launch["model"], dtype=torch.float32)
    if staged is not None:
        load_staged_weights(RUN / SETTINGS["files"]["staged"], staged, model)
    target = RUN / "initial_model"
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)


def load_staged_weights(folder, manifest_sha256, model):
    """model.from_run: the checkpoint the hub staged, checked again here (its manifest is the
    one the spec names, every file the one the manifest lists), then its weights loaded into
    ``model``: ``weights.safetensors`` of a native checkpoint or ``model.safetensors`` of a TRL
    one, either holding exactly the model's parameters. Only the weights: never that run's
    optimizer, data position or RNG."""
    from safetensors.torch import load_file

    manifest = folder / SETTINGS["files"]["manifest"]
    if not manifest.is_file():
        raise SystemExit(f"model.from_run: {folder} has no {manifest.name}, not a staged "
                         "checkpoint")
    actual = sha256_synced(manifest)
    if actual != manifest_sha256:
        raise SystemExit(f"model.from_run: {manifest} has sha256 {actual}, the spec names "
                         f"{manifest_sha256}")
    for name, digest in sorted(json.loads(manifest.read_text(encoding="utf-8"))["files"]
                               .items()):
        path = folder / name
        if path.is_symlink() or not path.is_file() or sha256_synced(path) != digest:
            raise SystemExit(f"model.from_run: {path} is missing or does not match the "
                             "manifest")
    weights = next((folder / n for n in ("weights.safetensors", "model.safetensors")
                    if (folder / n).is_file()), None)
    if weights is None:
        raise SystemExit(f"model.from_run: {folder} holds no weights.safetensors or "
                         "model.safetensors")
    state = load_file(str(weights))
    names = {name for name, _ in model.named_parameters()}
    if set(state) != names:
        raise SystemExit(f"model.from_run: {weights} does not hold exactly this model's "
                         f"parameters ({len(set(state) - names)} unknown, "
                         f"{len(names - set(state))} missing)")
    model.load_state_dict(state, strict=False)
    print(f"stateset-trl: starting from {weights.name} of the staged checkpoint "
          f"({manifest_sha256[:12]})", flush=True)


def render(launch, tokenizer, text):
    """A prompt as the native engine renders it: one user message in the chat template, or
    the text as it is."""
    if not launch["chat_template"]:
        return text
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


def fitting_rows(launch, tokenizer, uri, prompt_field, answer_field, split):
    """(prompt text, answer) of every row within max_prompt_tokens, under prompt_overflow."""
    rows, kept = read_rows(uri), []
    limit, chat = launch["max_prompt_tokens"], launch["chat_template"]
    for index, row in enumerate(rows):
        text = row[prompt_field]
        answer = row.get(answer_field, "") if answer_field else ""
        length = len(tokenizer(render(launch, tokenizer, text),
                               add_special_tokens=not chat)["input_ids"])
        if length > limit:
            if launch["prompt_overflow"] == "error":
                raise SystemExit(f"data.{split} row {index}: prompt has {length} tokens, over "
                                 f"data.max_prompt_tokens {limit}")
            continue
        kept.append((text, answer))
    print(f"stateset-trl: {split}: {len(kept)} of {len(rows)} prompts within {limit} tokens",
          flush=True)
    if not kept:
        raise SystemExit(f"data.{split}: every prompt exceeds max_prompt_tokens {limit}")
    return kept


def prompt_rows(launch, tokenizer):
    chat = launch["chat_template"]
    return [{"prompt": [{"role": "user", "content": text}] if chat else text,
             "stateset_prompt": text, "stateset_answer": answer}
            for text, answer in fitting_rows(launch, tokenizer, launch["train_uri"],
                                             launch["prompt_field"], launch["answer_field"],
                                             "train")]


def sft_examples(launch, tokenizer, uri, prompt_field, answer_field, split):
    """Prompt/answer rows as SFTTrainer's tokenized prompt/completion rows: ``input_ids`` the
    prompt as it is sampled from (template, special tokens) then the answer, ended by EOS and
    cut at max_response_tokens; ``completion_mask`` 1 on the answer's tokens only, from which
    SFTTrainer builds the labels (-100 on every prompt token)."""
    chat, out = launch["chat_template"], []
    for text, answer in fitting_rows(launch, tokenizer, uri, prompt_field, answer_field, split):
        prompt = tokenizer(render(launch, tokenizer, text),
                           add_special_tokens=not chat)["input_ids"]
        if not prompt:
            raise SystemExit(f"data.{split}: a prompt encodes to no tokens; the first answer "
                             "token needs one to be predicted from")
        answer_ids = (tokenizer(str(answer), add_special_tokens=False)["input_ids"]
                      + [tokenizer.eos_token_id])[:launch["max_response_tokens"]]
        out.append({"input_ids": prompt + answer_ids,
                    "completion_mask": [0] * len(prompt) + [1] * len(answer_ids)})
    return out


def validation_loss(model, tokenizer, examples):
    """val/loss and val/token_accuracy as the native engine computes them: teacher-forced,
    per answer token over the whole split (whatever the training aggregation)."""
    import torch

    was_training, loss_sum, right, tokens = model.training, 0.0, 0.0, 0
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(examples), 64):
                part = examples[start:start + 64]
                width = max(len(e["input_ids"]) for e in part)
                ids = torch.full((len(part), width), tokenizer.pad_token_id, dtype=torch.long)
                mask = torch.zeros((len(part), width), dtype=torch.long)
                learn = torch.zeros((len(part), width), dtype=torch.bool)
                for n, e in enumerate(part):
                    ids[n, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
                    mask[n, :len(e["input_ids"])] = 1
                    learn[n, :len(e["input_ids"])] = torch.tensor(e["completion_mask"]) > 0
                ids, mask, learn = (t.to(model.device) for t in (ids, mask, learn))
                logits = model(input_ids=ids, attention_mask=mask).logits.float()
                logp = torch.log_softmax(logits[:, :-1], dim=-1)  # t predicts t + 1
                targets, learned = ids[:, 1:], learn[:, 1:]
                nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                loss_sum += float(nll[learned].sum())
                right += float((logp.argmax(-1) == targets)[learned].sum())
                tokens += int(learned.sum())
    finally:
        model.train(was_training)
    return {"val/loss": loss_sum / tokens, "val/token_accuracy": right / tokens}


def validation_reward(model, tokenizer, launch, rows, score):
    """val/reward/mean as the native engine computes it: evaluation.samples responses per
    validation prompt, decoded as evaluation says (temperature 0 = greedy, top_p, no top-k),
    at most data.max_response_tokens each, scored by the spec's reward."""
    import torch
    from transformers import GenerationConfig

    v = launch["validation"]
    greedy = v["temperature"] == 0
    config = GenerationConfig(
        do_sample=not greedy, temperature=None if greedy else v["temperature"],
        top_p=None if greedy else v["top_p"], top_k=None if greedy else 0,
        num_return_sequences=v["samples"], max_new_tokens=v["max_new_tokens"],
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    was_training, rewards = model.training, []
    model.eval()
    chunk = max(1, 64 // v["samples"])
    try:
        with torch.no_grad():
            for start in range(0, len(rows), chunk):
                part = rows[start:start + chunk]
                enc = tokenizer([render(launch, tokenizer, t) for t, _ in part],
                                add_special_tokens=not launch["chat_template"], padding=True,
                                padding_side="left", return_tensors="pt").to(model.device)
                out = model.generate(**enc, generation_config=config)
                texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:],
                                               skip_special_tokens=True)
                for n, response in enumerate(texts):
                    text, answer = part[n // v["samples"]]
                    rewards.append(float(score(text, response, answer)))
    finally:
        model.train(was_training)
    return sum(rewards) / len(rewards)


def retention_callback(launch, validated, k, best=None):
    """Seals each checkpoint TRL saves (``seal``), then applies checkpoint.keep as the hub
    means it: the newest ``keep`` checkpoints and the best so far by evaluation.select_by
    (highest, lowest for a loss or a failure share, the earlier update on a tie), the one the
    hub will recommend; TRL's save_total_limit would delete the oldest whatever their
    validation. ``validated`` maps an optimizer step to its validation row; ``best`` is the
    (value, step) a resumed run's earlier attempts kept (in their own folders, which this
    attempt never touches)."""
    import shutil

    from transformers import TrainerCallback

    keep, select_by = launch.get("keep"), launch.get("select_by")
    lower = launch.get("lower_is_better", False)

    class Retention(TrainerCallback):
        def __init__(self):
            self.best = best  # (value, step) of the best validated checkpoint so far

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir)
            value = validated.get(state.global_step, {}).get(select_by)
            if select_by is not None and value is not None and math.isfinite(value):
                better = self.best is None or (value < self.best[0] if lower
                                               else value > self.best[0])
                if better:  # a tie keeps the earlier update
                    self.best = [value, state.global_step]
            seal(folder / f"checkpoint-{state.global_step}", state.global_step // k, self.best)
            if keep is None:
                return
            saved = sorted((int(p.name.removeprefix("checkpoint-")), p)
                           for p in folder.glob("checkpoint-*") if p.is_dir())
            kept = {step for step, _ in saved[-keep:]}
            if self.best is not None:
                kept.add(self.best[1])
            for step, path in saved:
                if step not in kept:
                    shutil.rmtree(path, ignore_errors=True)

    return Retention()


def replayable(trainer_class):
    """GRPOTrainer whose prompt order a resume replays exactly. TRL's sampler draws each pass
    over the data from one generator seeded once, so a run resumed in a later pass would draw
    the first pass's order again; here the sampler's generator is set, at the start of every
    pass, to the state that many earlier passes leave it in: an uninterrupted run draws the
    same orders as before, and a resumed one draws the orders it would have."""

    class Trainer(trainer_class):
        def _get_train_sampler(self, dataset=None):
            sampler = super()._get_train_sampler(dataset)
            if not getattr(sampler, "shuffle", False) or getattr(sampler, "seed", None) is None:
                return sampler
            import torch

            def set_epoch(epoch):
                sampler.generator.manual_seed(sampler.seed)
                for _ in range(epoch):
                    torch.randperm(sampler.num_samples, generator=sampler.generator)

            sampler.set_epoch = set_epoch
            return sampler

    return Trainer


def main():
    from datasets import Dataset
    from transformers import TrainerCallback

    sys.path.insert(0, str(RUN))
    import stateset_reward

    sft = SETTINGS["trainer"] == "sft"
    if sft:
        from trl import SFTConfig as Config
        from trl import SFTTrainer as TrainerClass
    else:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer

        TrainerClass = replayable(GRPOTrainer)
    launch, files, k = SETTINGS["launch"], SETTINGS["files"], SETTINGS["steps_per_update"]
    config = dict(SETTINGS["config"])
    config["output_dir"] = str(RUN / config["output_dir"])
    args = Config(**config)
    resume = resume_point()
    resumed = resumed_state(resume) if resume is not None else None
    # the identity as TRL carries it (its run name), written before anything can fail
    identity = {"run_name": args.run_name, "trainer": SETTINGS["trainer"],
                "steps_per_update": k,
                "resumed_from": resumed["update"] if resumed is not None else None}
    (RUN / files["identity"]).write_text(json.dumps(identity) + "\n", encoding="utf-8")

    tokenizer = load_tokenizer(launch)
    model = initial_model(launch, tokenizer, SETTINGS["seed"])
    if sft:
        dataset = Dataset.from_list(sft_examples(
            launch, tokenizer, launch["train_uri"], launch["prompt_field"],
            launch["answer_field"], "train"))
    else:
        dataset = Dataset.from_list(prompt_rows(launch, tokenizer))
    metrics = open(RUN / files["metrics"], "a", encoding="utf-8")  # noqa: SIM115
    validated = {}  # optimizer step -> the spec's validation there
    logged = "loss" if sft else "reward"  # in every update's log, not in the closing summary

    def record(doc):
        metrics.write(json.dumps(doc) + "\n")
        metrics.flush()
        os.fsync(metrics.fileno())

    class UpdateMetrics(TrainerCallback):
        """One line per update: TRL logs every k optimizer steps (logging_steps)."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and logged in logs and state.global_step % k == 0:
                record({"update": state.global_step // k, "step": state.global_step,
                        "logs": logs})

    class Validation(TrainerCallback):
        """The spec's validation, on the untrained policy and every evaluation.every updates
        (TRL's own evaluation samples like its rollouts, so it stays off): the validation
        reward, and for sft the teacher-forced loss and token accuracy of the answers."""

        def __init__(self, rows, examples):
            self.rows, self.examples = rows, examples
            self.every = launch["validation"]["every"]

        def run(self, model, update):
            row = {"val/reward/mean": validation_reward(model, tokenizer, launch, self.rows,
                                                        stateset_reward.score)}
            if self.examples is not None:
                row.update(validation_loss(model, tokenizer, self.examples))
            validated[update * k] = row
            record({"update": update, "validation": row})

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if state.global_step == 0:
                self.run(model, 0)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % (k * self.every) == 0:
                self.run(model, state.global_step // k)

    callbacks = [UpdateMetrics(), retention_callback(
        launch, validated, k, resumed["best"] if resumed is not None else None)]
    validation = launch.get("validation")
    if validation is not None:
        split = (validation["uri"], validation["prompt_field"], validation["answer_field"],
                 "validation")
        callbacks.append(Validation(
            fitting_rows(launch, tokenizer, *split),
            sft_examples(launch, tokenizer, *split) if sft else None))
    if sft:
        trainer = TrainerClass(model=model, args=args, train_dataset=dataset,
                               processing_class=tokenizer, callbacks=callbacks)
    else:
        trainer = TrainerClass(
            model=model, reward_funcs=[stateset_reward.trl_reward], args=args,
            train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    metrics.close()
    if trainer.state.global_step != args.max_steps:
        raise SystemExit(f"TRL stopped after {trainer.state.global_step} of {args.max_steps} "
                         "optimizer steps")
    trainer.save_model(str(RUN / files["final"]))


main()
