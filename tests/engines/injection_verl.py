"""Compose Hydra overrides against verl trainer configs and read them as verl does, many at
once: run with verl's own interpreter (its Hydra and OmegaConf; verl registers no resolvers of
its own, so verl itself is not imported). Reads a JSON list of {"config_dir", "overrides"} on stdin;
prints a JSON list of {"config": <resolved config>} or {"error": <message>} on stdout, one per
job, in order."""

import json
import sys

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

jobs = json.loads(sys.stdin.read())
results: list = [None] * len(jobs)
for config_dir in dict.fromkeys(job["config_dir"] for job in jobs):
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        for i, job in enumerate(jobs):
            if job["config_dir"] != config_dir:
                continue
            try:
                cfg = compose(config_name="ppo_trainer", overrides=job["overrides"])
                # verl's read path: main_ppo's TaskRunner resolves the config in place, then
                # hydra.utils.instantiate resolves each _target_ section's copy in place
                # again, and every read interpolates once more
                OmegaConf.resolve(cfg)
                OmegaConf.resolve(cfg)
                results[i] = {"config": OmegaConf.to_container(cfg, resolve=True)}
            except Exception as exc:  # reported per job, so one failure names its job
                results[i] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(results, default=str))
