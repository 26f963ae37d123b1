"""Stand-ins for TRL and what the generated launch imports around it, for the conformance
kit's launch-run check: the launch script runs for real around a stub ``GRPOTrainer`` that
records the GRPOConfig it was handed, scores the kit's cases through the reward function
exactly as TRL calls it (``prompts``, ``completions`` and every other dataset column as a
keyword list), then "trains": ``max_steps`` optimizer steps, each logged to the callbacks
under TRL's own log keys, and saves the final model where it is asked to. The kit then
collects the run and compares it with what the stub logged."""

TRL = '''
from stateset_kit_stub import cases, received


class GRPOConfig:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.__dict__.update(kwargs)


class _State:
    global_step = 0


class GRPOTrainer:
    def __init__(self, model, reward_funcs, args, train_dataset, callbacks=(), **kwargs):
        (reward,) = reward_funcs
        columns = {c: [row[c] for row in train_dataset.rows[:2]] for c in train_dataset.rows[0]}
        self.args, self.callbacks, self.state = args, list(callbacks), _State()
        self.rewards = reward(prompts=[c["prompt"] for c in cases()],
                              completions=[c["response"] for c in cases()],
                              stateset_prompt=[c["prompt"] for c in cases()],
                              stateset_answer=[c["answer"] for c in cases()])
        self.rows, self.logged = len(train_dataset.rows), []
        if sorted(columns) != ["prompt", "stateset_answer", "stateset_prompt"]:
            raise SystemExit(f"unexpected dataset columns {sorted(columns)}")

    def train(self, resume_from_checkpoint=None):
        if resume_from_checkpoint is not None:  # the kit runs the launch as planned, fresh
            raise SystemExit("the kit's launch run resumes nothing")
        k = self.args.logging_steps  # TRL logs every logging_steps optimizer steps
        for cb in self.callbacks:
            cb.on_train_begin(self.args, self.state, None, model=None)
        for step in range(1, self.args.max_steps + 1):
            self.state.global_step = step
            if step % k == 0:
                logs = {"loss": 0.5 / step, "reward": round(0.1 * step, 6), "reward_std": 0.1,
                        "kl": 0.01 * step, "entropy": 1.0, "learning_rate": 1e-6}
                for cb in self.callbacks:
                    cb.on_log(self.args, self.state, None, logs=logs)
                self.logged.append({"step": step // k, "reward/mean": logs["reward"]})
            for cb in self.callbacks:
                cb.on_step_end(self.args, self.state, None, model=None)

    def save_model(self, path):
        import os

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "model.safetensors"), "wb") as fh:
            fh.write(b"stub weights")
        received(config=self.args.kwargs, rewards=self.rewards, rows=self.rows,
                 logged=self.logged)
'''

DATASETS = '''
class Dataset:
    def __init__(self, rows):
        self.rows = rows

    @classmethod
    def from_list(cls, rows):
        return cls(list(rows))
'''

# a character tokenizer and the few transformers names the launch imports before training
TRANSFORMERS = '''
class Tokenizer:
    pad_token_id = None
    eos_token = "</s>"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False,
                            **kwargs):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + (
            "<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=True, **kwargs):
        return {"input_ids": [ord(c) % 256 for c in text]}

    def save_pretrained(self, path):
        pass

    @property
    def pad_token(self):
        return self.eos_token

    @pad_token.setter
    def pad_token(self, value):
        self.pad_token_id = 0


class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        return Tokenizer()


class _Model:
    def save_pretrained(self, path):
        pass


class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        return object()


class AutoModelForCausalLM:
    @staticmethod
    def from_config(*args, **kwargs):
        return _Model()


class TrainerCallback:
    def on_train_begin(self, *args, **kwargs):
        pass

    def on_log(self, *args, **kwargs):
        pass

    def on_step_end(self, *args, **kwargs):
        pass


class GenerationConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
'''

STUB = {"trl/__init__.py": TRL, "datasets/__init__.py": DATASETS,
        "transformers/__init__.py": TRANSFORMERS}
