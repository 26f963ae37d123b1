"""The support-agent environment: a customer asks about an order.

The agent must look the order up (tool ``lookup``, no argument: the environment knows the
customer's order once it is named) before it answers, and answer with the status word the tool
returned. The tool says the status five times ("lost lost lost lost lost"): the same
information, a stronger signal for a policy that starts from random weights and has to learn
to copy it. When the customer did not say which order, the agent must first ask one
clarifying question (a turn whose first word is "which"); the customer then names it. Rewards
come per step and add up to 1.0 for a conversation done right:

- named order:  lookup 0.3, then the status the tool returned 0.7;
- vague ask:    the clarifying question 0.2, lookup 0.2, the status the tool returned 0.6.

Nothing is paid for merely trying: a lookup before the customer named the order, a question
nobody needed, a second question or lookup, or an answer before the lookup ends the
conversation with 0 for that turn, as does any wrong answer. An agent that always looks up but
guesses the status earns about half; the rest needs the copy. The interface is the
engine-neutral one of docs/environments.md (reset / step / tools); nothing here imports the
engine.
"""


class SupportAgent:
    tools = [{
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look up the status of the order the customer named",
            "parameters": {"type": "object", "properties": {}},
        },
    }]

    def reset(self, task):
        self.order, self.status, self.vague = task["order"], task["status"], task["vague"]
        self.named = not self.vague  # does the environment know which order yet?
        self.asked = self.looked_up = False
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, messages):
        turn = messages[-1]
        if turn.get("tool_calls"):
            return self._lookup(turn["tool_calls"][0])
        if turn["content"].split()[:1] == ["which"]:
            return self._question()
        right = self.looked_up and turn["content"].split()[:1] == [self.status]
        reward = (0.6 if self.vague else 0.7) if right else 0.0
        return self._end(reward)

    def _lookup(self, call):
        if call["name"] != "lookup" or not self.named or self.looked_up:
            return self._end(0.0)
        self.looked_up = True
        return {"observations": [{"role": "tool", "name": "lookup",
                                  "content": " ".join([self.status] * 5)}],
                "reward": 0.2 if self.vague else 0.3, "done": False}

    def _question(self):
        if not self.vague or self.asked:
            return self._end(0.0)
        self.asked = self.named = True
        return {"observations": [{"role": "user", "content": f"order {self.order}"}],
                "reward": 0.2, "done": False}

    @staticmethod
    def _end(reward):
        return {"observations": [], "reward": reward, "done": True}
