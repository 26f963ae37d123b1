"""The batch script of a Slurm plan, built the way each engine documents running on Slurm.

- A plain process (and the native engine on one node): one job step on the first node.
- torchrun (the native engine across nodes): one step per node; torchrun's own environment
  variables (``PET_NNODES``, ``PET_RDZV_*``) point every node's agent at a rendezvous on the
  first node, so the launch's argv is the same on every node.

The job asks for a CPU per process it starts, and its ports come from its job id (a fixed
port would let two jobs whose first node is the same host meet, or fail, at one port).
- Ray (verl, OpenRLHF, NeMo RL): a Ray head on the first node, one worker per other node, all
  ``srun --overlap`` steps; once every node has joined, the driver runs on the first node with
  ``RAY_ADDRESS`` set, which each engine's ``ray.init()`` connects to (verl runs its trainer
  as the driver; OpenRLHF's and NeMo RL's entry points do the same).

The script is fixed text: the engine's argv and environment are read from NUL-separated files
the provider writes into ``slurm/`` at run time, never spliced into shell syntax, and every
``#SBATCH`` value comes from :class:`SlurmSettings`, validated to what Slurm accepts.
Slurm's warning signal (``--signal=B:USR1@N``: before the time limit or a pre-emption) makes
the script create the run directory's stop request; an engine that honours it checkpoints
and stops at the end of its current update (:data:`STOP_REQUEST`).
"""

from __future__ import annotations

import re
import shlex
from typing import Literal

from stateset_backend.common.errors import Unsupported
from stateset_backend.providers.base import EXIT_STOPPED, STOP_REQUEST
from stateset_backend.providers.slurm.settings import SlurmSettings

ClusterLaunch = Literal["process", "torchrun", "ray"]
SCRIPT_FILE = "slurm/job.sbatch"
ARGV_FILE = "slurm/argv"  # the engine's argv, NUL-separated, placeholders filled
ENV_FILE = "slurm/env"  # NAME=value items the plan sets, NUL-separated
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# A job's ports (three for Ray: GCS, client server, dashboard agent) start at
# PORT_FLOOR + (job id % PORT_SLOTS) * 3: above Ray's worker ports (10002-19999), below Linux's
# ephemeral ports (32768-), so a job's listeners never take a port the kernel hands out
PORT_FLOOR, PORT_SLOTS = 20000, 3000

_PREAMBLE = r"""set -euo pipefail
# The launch, as data: argv and environment from NUL-separated files (never shell text).
mapfile -d '' -t ENGINE < {argv}
while IFS= read -r -d '' item; do export "$item"; done < {env}
stop_file="$PWD/{stop}"
rm -f "$stop_file"
# Slurm's warning before the time limit or a pre-emption: ask the engine to checkpoint and stop.
trap 'touch "$stop_file"' USR1
trap 'cancelled=1' TERM  # scancel: Slurm signals the steps too
cancelled=0

wait_for() {{  # a step's exit status, waiting again when a trapped signal interrupts `wait`
    local pid=$1 rc
    while :; do
        rc=0; wait "$pid" || rc=$?
        if [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
        if [ "$rc" -gt 128 ]; then rc=0; wait "$pid" || rc=$?; fi
        return "$rc"
    done
}}

finish() {{  # the job's status: the engine's, or 75 when it stopped on the stop request
    local rc=$1
    if [ "$cancelled" = 1 ]; then exit 143; fi
    if [ "$rc" != 0 ] && [ -e "$stop_file" ]; then exit {stopped}; fi
    exit "$rc"
}}

nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head_node=${{nodes[0]}}
# every step gets the job's CPUs per node (srun no longer reads SLURM_CPUS_PER_TASK)
export SRUN_CPUS_PER_TASK="${{SLURM_CPUS_PER_TASK:-1}}"
# this job's own ports, from its id unless the plan fixes them: two jobs whose first node is
# the same host never meet at one port; recorded in the attempt and its log
port_base=$(( {port_floor} + SLURM_JOB_ID % {port_slots} * 3 ))
"""

_PROCESS = r"""srun --overlap --nodes=1 --ntasks=1 -w "$head_node"{container} "${{ENGINE[@]}}" &
rc=0; wait_for $! || rc=$?
finish "$rc"
"""

_TORCHRUN = r"""port={port}
printf 'rendezvous_port=%s\n' "$port" > slurm/ports
# Threads for each engine process: the CPUs Slurm gave the node shared among its {processes}
# process(es), unless set. torchrun sets 1 only where a node runs several processes, so
# without this 2 nodes x 1 process would compute with other threads (and other rounding) than
# 1 node x 2 processes.
threads=$(( SRUN_CPUS_PER_TASK / {processes} ))
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-$(( threads > 0 ? threads : 1 ))}}"
if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then
    # the first node's address as Slurm knows it (its NodeAddr; the name where none is set)
    head_addr=$(scontrol show node -o "$head_node" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
    head_addr=${{head_addr:-$head_node}}
    echo "stateset-backend: rendezvous on $head_addr:$port" >&2
    # every node's torchrun agent meets at a rendezvous on the first node
    export PET_NNODES="$SLURM_JOB_NUM_NODES" PET_RDZV_BACKEND=c10d
    export PET_RDZV_ENDPOINT="$head_addr:$port" PET_RDZV_ID="stateset-$SLURM_JOB_ID"
    srun --ntasks-per-node=1 --kill-on-bad-exit=1{container} "${{ENGINE[@]}}" &
else
    srun --overlap --nodes=1 --ntasks=1 -w "$head_node"{container} "${{ENGINE[@]}}" &
fi
rc=0; wait_for $! || rc=$?
finish "$rc"
"""

_RAY = r"""python=${{ENGINE[0]}}  # the engine's interpreter, which has Ray
ray_main='import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()'
ray_cli=("$python" -c "$ray_main")
alive='import os, ray
ray.init(logging_level="ERROR", _node_ip_address=os.environ["STATESET_HEAD_IP"])
print(sum(n["Alive"] for n in ray.nodes()))'
head_ip=${{STATESET_RAY_IP:-}}
if [ -z "$head_ip" ]; then
    head_ip=$(srun --overlap -N1 -n1 -w "$head_node" hostname --ip-address | awk '{{print $1}}')
fi
port={port}
printf 'ray_port=%s\nray_client_server_port=%s\ndashboard_agent_listen_port=%s\n' \
    "$port" $((port + 1)) $((port + 2)) > slurm/ports
echo "stateset-backend: Ray head on $head_ip:$port" >&2
export RAY_ADDRESS="$head_ip:$port" STATESET_HEAD_IP="$head_ip"
# Ray's token authentication: `ray start` turns it on by itself where a token exists, a process
# that connects to an address does not, so the job sets one mode for all its Ray processes.
# The token stays where the user keeps it (RAY_AUTH_TOKEN or the token file): never in a file
# of the run.
if [ -z "${{RAY_AUTH_MODE:-}}" ] && {{ [ -n "${{RAY_AUTH_TOKEN:-}}" ] ||
        [ -s "${{RAY_AUTH_TOKEN_PATH:-${{HOME:-/nonexistent}}/.ray/auth_token}}" ]; }}; then
    export RAY_AUTH_MODE=token
fi
# Ray schedules onto the CPUs Slurm gave the job, and its fixed-port listeners move with the job
ray_common=(--temp-dir "${{TMPDIR:-/tmp}}/stateset-ray-$SLURM_JOB_ID" --disable-usage-stats
            --num-cpus "$SRUN_CPUS_PER_TASK" --dashboard-agent-listen-port $((port + 2)))
srun --overlap -N1 -n1 -w "$head_node"{container} "${{ray_cli[@]}}" start --head \
    --node-ip-address="$head_ip" --port="$port" --ray-client-server-port=$((port + 1)) \
    --include-dashboard=false "${{ray_common[@]}}" --block &
for ((i = 1; i < ${{#nodes[@]}}; i++)); do
    srun --overlap -N1 -n1 -w "${{nodes[$i]}}"{container} "${{ray_cli[@]}}" start \
        --address "$RAY_ADDRESS" "${{ray_common[@]}}" --block &
done
# the driver starts once every node has joined the cluster
until [ "$("$python" -c "$alive" 2>/dev/null)" = "${{#nodes[@]}}" ]; do sleep 0.5; done
srun --overlap --nodes=1 --ntasks=1 -w "$head_node"{container} "${{ENGINE[@]}}" &
rc=0; wait_for $! || rc=$?
finish "$rc"  # Slurm ends the Ray steps when the script exits
"""


def cpus_per_node(launch: ClusterLaunch, processes: int) -> int:
    """CPUs for every process the job starts on a node: one per engine process, and on the
    Ray layout one more for the driver (Ray's own daemons share them)."""
    return processes + (1 if launch == "ray" else 0)


def render(settings: SlurmSettings, *, launch: ClusterLaunch, run_id: str, engine: str,
           nodes: int, gpus_per_node: int, processes_per_node: int | None = None) -> str:
    """The batch script: ``#SBATCH`` lines from validated settings, then the engine's layout.
    ``processes_per_node`` is the engine's (the spec's ``resources``); without it one per GPU,
    else one."""
    if not (_NAME.fullmatch(run_id) and _NAME.fullmatch(engine)):
        raise Unsupported(f"the Slurm provider names its job after the run and the engine, "
                          f"and {engine!r} is not a name Slurm can carry")
    lines = ["#!/bin/bash",
             f"# stateset-backend run {run_id}: {engine} on Slurm ({launch}); the launch is read",
             "# from slurm/argv and slurm/env in the run directory (sbatch --chdir).",
             f"#SBATCH --job-name=stateset-{run_id}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --time={settings.time_limit}",
             f"#SBATCH --signal=B:USR1@{settings.checkpoint_warning_s}",
             # a requeue would restart the script in the same attempt; the hub resumes instead
             "#SBATCH --no-requeue"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    processes = processes_per_node or gpus_per_node or 1
    cpus = settings.cpus_per_task or cpus_per_node(launch, processes)
    for flag, value in (("partition", settings.partition), ("account", settings.account),
                        ("qos", settings.qos), ("cpus-per-task", cpus)):
        if value is not None:
            lines.append(f"#SBATCH --{flag}={value}")
    container = ""
    if settings.container_image is not None:
        mount = f"{settings.shared_root}:{settings.shared_root}"
        container = (f" --container-image={shlex.quote(settings.container_image)}"
                     f" --container-mounts={shlex.quote(mount)}"
                     ' --container-workdir="$PWD"')
    body = {"process": _PROCESS, "torchrun": _TORCHRUN, "ray": _RAY}[launch]
    fixed = settings.ray_port if launch == "ray" else settings.rendezvous_port
    text = _PREAMBLE.format(argv=ARGV_FILE, env=ENV_FILE, stop=STOP_REQUEST,
                            stopped=EXIT_STOPPED, port_floor=PORT_FLOOR,
                            port_slots=PORT_SLOTS) + \
        body.format(container=container, port="$port_base" if fixed is None else fixed,
                    processes=processes)
    return "\n".join(lines) + "\n\n" + text
