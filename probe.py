import sys, tempfile, os
sys.path.insert(0, "/work/main/tests/mutation"); sys.path.insert(0, "/tmp/rt5")
from pathlib import Path
import mutation_run
from run_rt5 import MINE
mu = [m for m in MINE if sys.argv[1] in m.name][0]
tmp = Path(tempfile.mkdtemp(prefix="rt5-probe-", dir="/tmp/rt5"))
mutation_run._copy(tmp); mutation_run.apply(mu, tmp)
print(tmp)
