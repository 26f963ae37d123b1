"""The support-agent environment: a customer asks about an order.

The agent must look the order up (tool ``lookup``) before it answers with the order's status.
When the customer did not say which order, the agent must first ask one clarifying question
(a turn containing the word "which"); the customer then names it. Rewards come per step and
add up to 1.0 for a conversation done right:

- named order:  lookup of that order 0.3, then the right status 0.7;
- vague ask:    the clarifying question 0.2, lookup 0.3, the right status 0.5.

The first lookup call earns 0.1 of its 0.3 even with a wrong order (trying the tool is the
first thing to learn); the right order later earns the remaining 0.2. Any other turn earns 0;
an answer, or a question nobody needed, ends the conversation. The interface is the
engine-neutral one of docs/environments.md (reset / step / tools); nothing here imports the
engine.
"""

STATUSES = {"shipped", "delayed", "delivered", "lost"}


class SupportAgent:
    tools = [{
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look up an order's status by its id",
            "parameters": {
                "type": "object",
                "properties": {"order": {"type": "string", "description": "order id, e.g. o3"}},
                "required": ["order"],
            },
        },
    }]

    def reset(self, task):
        self.order, self.status, self.vague = task["order"], task["status"], task["vague"]
        self.named = not self.vague  # may the agent look this order up yet?
        self.asked = self.looked_up = self.tried = False
        return [{"role": "user", "content": task["prompt"]}]

    def step(self, messages):
        turn = messages[-1]
        if turn.get("tool_calls"):
            return self._lookup(turn["tool_calls"][0])
        words = turn["content"].split()
        if "which" in words and not (words and words[0] in STATUSES):
            return self._question()
        right = self.looked_up and words[:1] == [self.status]
        reward = (0.5 if self.vague else 0.7) if right else 0.0
        return {"observations": [], "reward": reward, "done": True}

    def _lookup(self, call):
        order = str(call["arguments"].get("order", "")).split()[:1]
        first, self.tried = not self.tried, True
        if call["name"] == "lookup" and self.named and order == [self.order] \
                and not self.looked_up:
            self.looked_up = True
            return {"observations": [{"role": "tool", "name": "lookup",
                                      "content": f"order {self.order} : {self.status}"}],
                    "reward": 0.3 if first else 0.2, "done": False}
        return {"observations": [{"role": "tool", "name": "lookup", "content": "no order found"}],
                "reward": 0.1 if first and self.named else 0.0, "done": False}

    def _question(self):
        if self.vague and not self.asked and not self.looked_up:
            self.asked = self.named = True
            return {"observations": [{"role": "user", "content": f"it is order {self.order}"}],
                    "reward": 0.2, "done": False}
        return {"observations": [{"role": "user",
                                  "content": f"i already said order {self.order}"}],
                "reward": 0.0, "done": True}
