"""Support agent: a customer asks about an order; the agent must look it up before answering
with the status the lookup returned, or first ask which order when the customer did not say.

Generated deterministically from a seed (no download): the task rows of the train /
validation / test splits, and the words the built-in ``tiny-llama-agent`` tokenizer knows (the
conversation format's role tags and every word a customer, the lookup tool or a correct agent
can say; kept small, so that a policy initialised from scratch samples each of them often
enough to learn from). The environment itself is user code:
``examples/support-agent/environment.py``.

The ``lookup`` tool takes no argument: the environment knows the customer's order once the
customer has named it, and the tool answers with the order's status word (said five times).
Every status is equally likely and hidden from the customer's message, so only copying what
the tool returned answers right more than a quarter of the time.

    python -m stateset_backend.native.scenarios.support_agent OUT_DIR [--seed 0]
"""

from __future__ import annotations

import random

ORDERS = ["o1", "o2", "o3", "o4"]
STATUSES = ["shipped", "delayed", "delivered", "lost"]
OPENERS = ["hi", "hello"]
CLEAR = ["where is order {order} ?", "status of order {order} ?"]
VAGUE = ["where is my order ?", "status of my order ?"]
# what the environment says back: the customer naming the order ("order o3"), the tool's
# status word (kept here so the tokenizer knows every word of it)
ENVIRONMENT_WORDS = ["order", *ORDERS, *STATUSES]
AGENT_WORDS = ["lookup", "which", *STATUSES]
SPLITS = {"train": 1000, "validation": 100, "test": 100}


def task(rng: random.Random) -> dict[str, object]:
    order, status, vague = rng.choice(ORDERS), rng.choice(STATUSES), rng.random() < 0.5
    ask = rng.choice(VAGUE) if vague else rng.choice(CLEAR).format(order=order)
    prompt = f"{rng.choice(OPENERS)} . {ask}"
    return {"prompt": prompt, "answer": status, "order": order, "status": status,
            "vague": vague}


def generate(seed: int = 0) -> dict[str, list[dict[str, object]]]:
    """Splits of task rows (a customer's message can repeat across rows: what differs is the
    order's hidden status, which only the lookup tool reveals)."""
    rng = random.Random(seed)
    return {split: [task(rng) for _ in range(size)] for split, size in SPLITS.items()}


def vocabulary() -> list[str]:
    """Every word of the conversation format and the scenario, in a stable order."""
    from stateset_backend.native.multiturn.conversation import FORMAT_WORDS

    texts = [*FORMAT_WORDS, *ORDERS, *STATUSES, *OPENERS, ".", *ENVIRONMENT_WORDS,
             *AGENT_WORDS, *CLEAR, *VAGUE]
    return sorted({w for t in texts for w in t.split()} - {"{order}"})


if __name__ == "__main__":
    from stateset_backend.native.scenarios import main

    main(generate, "generate the support-agent task rows")
