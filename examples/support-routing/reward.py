"""Reward for the support-routing scenario: the first word of the response is the action.

1.0 for the right action, 0.1 for a wrong but valid action (the answer has the right form),
0.0 otherwise.
"""

ACTIONS = {"refund", "reset_password", "track_order", "cancel_subscription", "update_address",
           "escalate"}


def score(prompt: str, response: str, answer: str) -> float:
    words = response.split()
    if not words:
        return 0.0
    if words[0] == answer:
        return 1.0
    return 0.1 if words[0] in ACTIONS else 0.0
