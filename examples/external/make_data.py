"""Write the external-engine example data: the support-routing splits as parquet rows in the
layout verl reads (chat-message prompt, reward_model.ground_truth, extra_info.prompt), which
OpenRLHF and NeMo RL read too. Needs pyarrow:  python make_data.py"""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "support-routing" / "data"

for split in ("train", "validation"):
    rows = [json.loads(line) for line in (SOURCE / f"{split}.jsonl").read_text().splitlines()]
    table = pa.Table.from_pylist([{
        "data_source": "support-routing",
        "prompt": [{"role": "user", "content": r["prompt"]}],
        "answer": r["answer"],
        "reward_model": {"style": "rule", "ground_truth": r["answer"]},
        "extra_info": {"prompt": r["prompt"], "index": i},
    } for i, r in enumerate(rows)])
    pq.write_table(table, HERE / "data" / f"{split}.parquet")
    print(split, len(rows))
