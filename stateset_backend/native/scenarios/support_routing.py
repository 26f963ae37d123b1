"""Customer-support routing: read a ticket, answer with the one action that resolves it.

Everything is generated deterministically from a seed (no download): the tickets and their
train/validation/test splits, and the word vocabulary the bundled tokenizer is built from.
A policy has to read the ticket's evidence words to choose among the actions, so the reward
measures real learning, while staying small enough to train on two CPU cores in minutes.

    python -m stateset_backend.native.scenarios.support_routing OUT_DIR [--seed 0]
"""

from __future__ import annotations

import random

ACTIONS: dict[str, list[str]] = {
    "refund": ["charged twice for my order", "want my money back", "refund the payment",
               "the item arrived broken and i want a refund", "overcharged on my invoice"],
    "reset_password": ["cannot log in to my account", "forgot my password",
                       "locked out after too many attempts", "password reset link expired",
                       "login code never arrives"],
    "track_order": ["where is my package", "order has not arrived yet",
                    "tracking number shows no update", "delivery is late",
                    "when will my parcel ship"],
    "cancel_subscription": ["stop my monthly plan", "cancel my subscription",
                            "do not renew my membership", "end the trial before it bills",
                            "unsubscribe me from the premium plan"],
    "update_address": ["i moved and need a new shipping address",
                       "change the delivery address", "wrong street on my profile",
                       "update my billing address", "ship to my office instead"],
    "escalate": ["this is the third time i am writing", "i want to speak to a manager",
                 "nobody has answered for a week", "i will file a complaint",
                 "your agent was rude to me"],
}
OPENERS = ["hello", "hi there", "good morning", "dear support", "hey team", "greetings"]
CLOSERS = ["thanks", "thank you", "please help", "regards", "asap please", "cheers"]
PRODUCTS = ["headphones", "blender", "laptop", "jacket", "camera", "lamp", "sneakers",
            "keyboard", "backpack", "watch"]
NAMES = ["alex", "sam", "jordan", "taylor", "morgan", "casey", "riley", "jamie"]

PROMPT_PREFIX = "ticket :"
PROMPT_SUFFIX = "action :"
SPLITS = {"train": 2000, "validation": 200, "test": 200}


def ticket(rng: random.Random) -> dict[str, str]:
    action = rng.choice(sorted(ACTIONS))
    body = rng.choice(ACTIONS[action])
    words = [rng.choice(OPENERS), "it is", rng.choice(NAMES), "about the",
             rng.choice(PRODUCTS), body, rng.choice(CLOSERS)]
    prompt = f"{PROMPT_PREFIX} {' '.join(words)} {PROMPT_SUFFIX}"
    return {"prompt": prompt, "answer": action}


def generate(seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """Disjoint splits: a prompt never appears in two splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, str]]] = {}
    for split, size in SPLITS.items():
        rows: list[dict[str, str]] = []
        while len(rows) < size:
            row = ticket(rng)
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
        splits[split] = rows
    return splits


def vocabulary() -> list[str]:
    """Every word a prompt or a correct answer can contain, in a stable order."""
    texts = [*OPENERS, *CLOSERS, *PRODUCTS, *NAMES, "it is", "about the", PROMPT_PREFIX,
             PROMPT_SUFFIX, *ACTIONS]
    for bodies in ACTIONS.values():
        texts.extend(bodies)
    return sorted({w for t in texts for w in t.split()})


if __name__ == "__main__":
    from stateset_backend.native.scenarios import main

    main(generate, "generate the support-routing data set")
