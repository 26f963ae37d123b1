"""A stand-in for ``kubectl`` against a KubeRay cluster, for tests (no cluster is reachable
offline).

It records every argv it is called with (one JSON line each, in ``$FAKE_KUBECTL_LOG``) and keeps
its state in ``$FAKE_KUBECTL_DIR``:

- ``apply -f FILE``: stores the RayJob; with ``FAKE_KUBECTL_RUN=1`` it then runs the job's
  entrypoint the way KubeRay's K8sJobMode submitter does: ``bash`` parses the entrypoint (it is
  spliced into the submitter's ``bash -c`` line), ``ray job submit`` joins the words it got with
  ``shlex.join``, and the job runs that with ``sh -c``, with the runtime env's ``env_vars``;
  the RayJob then ends ``Complete``/``SUCCEEDED`` or ``Failed``/``FAILED`` with Ray's message.
- ``get rayjob NAME -n NS -o json``: the RayJob with a status: the next of the canned statuses
  in ``$FAKE_KUBECTL_STATES`` (a JSON list; the last one repeats) when given, else the one the
  run left; NotFound before ``apply`` and after ``delete``.
- ``logs job/NAME``: what the run printed; ``delete rayjob NAME``: forgets it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml


def main(argv: list[str]) -> int:
    state = Path(os.environ["FAKE_KUBECTL_DIR"])
    with open(os.environ["FAKE_KUBECTL_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(argv) + "\n")
    verb = argv[0]
    if verb == "apply":
        manifest = yaml.safe_load(Path(argv[argv.index("-f") + 1]).read_text())
        name = manifest["metadata"]["name"]
        (state / f"{name}.json").write_text(json.dumps(manifest))
        if os.environ.get("FAKE_KUBECTL_RUN") == "1":
            _run(state, name, manifest)
        print(f"rayjob.ray.io/{name} created")
        return 0
    if verb == "get":
        name = argv[2]
        if not (state / f"{name}.json").is_file():
            print(f'Error from server (NotFound): rayjobs.ray.io "{name}" not found',
                  file=sys.stderr)
            return 1
        doc = json.loads((state / f"{name}.json").read_text())
        doc["status"] = _status(state, name)
        print(json.dumps(doc))
        return 0
    if verb == "logs":
        name = argv[-2].removeprefix("job/") if argv[-1].startswith("--") else argv[-1]
        path = state / f"{name.removeprefix('job/')}.log"
        print(path.read_text() if path.is_file() else "", end="")
        return 0
    if verb == "delete":
        (state / f"{argv[2]}.json").unlink(missing_ok=True)
        print(f'rayjob.ray.io "{argv[2]}" deleted')
        return 0
    print(f"fake kubectl: {verb} is not faked", file=sys.stderr)
    return 2


def _status(state: Path, name: str) -> dict:
    canned = os.environ.get("FAKE_KUBECTL_STATES")
    if canned:
        statuses = json.loads(Path(canned).read_text())
        counter = state / f"{name}.reads"
        reads = int(counter.read_text()) if counter.is_file() else 0
        counter.write_text(str(reads + 1))
        return statuses[min(reads, len(statuses) - 1)]
    path = state / f"{name}.status.json"
    return json.loads(path.read_text()) if path.is_file() else \
        {"jobDeploymentStatus": "Initializing", "jobStatus": ""}


def _run(state: Path, name: str, manifest: dict) -> None:
    spec = manifest["spec"]
    words = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + spec["entrypoint"]],
                           capture_output=True, check=True).stdout.decode().split("\0")[:-1]
    env_vars = (yaml.safe_load(spec.get("runtimeEnvYAML") or "") or {}).get("env_vars", {})
    done = subprocess.run(["sh", "-c", shlex.join(words)], capture_output=True, text=True,
                          env={**os.environ, **env_vars}, stdin=subprocess.DEVNULL)
    (state / f"{name}.log").write_text(done.stdout + done.stderr)
    ok = done.returncode == 0
    status = {"jobDeploymentStatus": "Complete" if ok else "Failed",
              "jobStatus": "SUCCEEDED" if ok else "FAILED"}
    if not ok:
        status.update(reason="AppFailed", message="Job entrypoint command failed with exit "
                                                  f"code {done.returncode}")
    (state / f"{name}.status.json").write_text(json.dumps(status))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
