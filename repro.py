import sys, tempfile, subprocess, os, json
sys.path.insert(0, "/work/main/tests/mutation"); sys.path.insert(0, "/tmp/rt5")
import mutation_run
from run_rt5 import MINE
name = sys.argv[1]
mu = [m for m in MINE if name in m.name][0]
tmp = tempfile.mkdtemp(prefix="rt5-repro-", dir="/tmp/rt5")
from pathlib import Path
mutation_run._copy(Path(tmp)); mutation_run.apply(mu, Path(tmp))
env = {**os.environ, "PYTHONPATH": tmp, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_ADDOPTS": " ".join(["-k", "'" + (sys.argv[2] if len(sys.argv) > 2 else "not engine_runs") + "'"])}
r = subprocess.run([sys.executable, "-m", "stateset_backend", "conformance", mu.engine, "--engine-version", mu.version, "--json", tmp + "/report.json"], cwd=tmp, env=env, capture_output=True, text=True)
print(r.returncode); print(r.stdout[-6000:]); print(r.stderr[-4000:])
print(tmp)
