"""A scripted stand-in engine: behaves well, or fails in one chosen, realistic way."""

import json
import math
import os
import random
import time
from pathlib import Path

from .launch_args import parser


def main() -> None:
    a = parser().parse_args()
    a.behaviour = a.behaviour or "ok"
    out = Path(a.out)
    Path(os.environ["ECHO_MARKER"]).write_text("started\n")
    if a.behaviour == "crash":
        raise SystemExit("echo engine: simulated crash")
    if a.behaviour == "hang":
        time.sleep(3600)
    if a.behaviour != "no-identity":
        (out / "identity.json").write_text(json.dumps({"run_id": a.run_id, "digest": a.digest}))
    rng = random.Random(a.seed)
    with open(out / "log.jsonl", "w") as fh:
        for k in range(1, a.updates + 1):
            score = math.nan if (a.behaviour == "nan" and k == a.updates) else rng.random()
            fh.write(json.dumps({"update": k, "score": score}) + "\n")
    if a.behaviour != "no-artifacts":
        (out / "weights.bin").write_bytes(bytes(rng.randrange(256) for _ in range(64)))
    print("echo engine: done")


if __name__ == "__main__":
    main()
