"""Stand-ins for TRL and what the generated launch imports around it, for the conformance
kit's launch-run check: the launch script runs for real up to ``GRPOTrainer(...)``, where the
stub records the GRPOConfig it was handed and scores the kit's cases through the reward
function exactly as TRL calls it (``prompts``, ``completions`` and every other dataset column
as a keyword list), then stops."""

TRL = '''
from stateset_kit_stub import cases, received


class GRPOConfig:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.__dict__.update(kwargs)


class GRPOTrainer:
    def __init__(self, model, reward_funcs, args, train_dataset, **kwargs):
        (reward,) = reward_funcs
        columns = [c for c in train_dataset.rows[0] if c != "prompt"]
        if columns != ["stateset_prompt", "stateset_answer"]:
            raise SystemExit(f"unexpected dataset columns {columns}")
        rewards = reward(prompts=[c["prompt"] for c in cases()],
                         completions=[c["response"] for c in cases()],
                         stateset_prompt=[c["prompt"] for c in cases()],
                         stateset_answer=[c["answer"] for c in cases()])
        received(config=args.kwargs, rewards=rewards, rows=len(train_dataset.rows))
        raise SystemExit(0)
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
    pass


class GenerationConfig:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
'''

STUB = {"trl/__init__.py": TRL, "datasets/__init__.py": DATASETS,
        "transformers/__init__.py": TRANSFORMERS}
