"""Inputs a spec accepts but an engine's own pipeline cannot use, found by running verl's
trainer in the conformance kit and refused at plan time since:

- a parquet split in plain ``{prompt, answer}`` rows: verl's dataset renders the prompt column
  as chat messages and drops every text row, then dies on an empty sampler
  (``num_samples=0``), after the queue wait; without ``extra_info.prompt`` the spec's reward
  would be given an empty prompt for every completion, silently;
- ``data.chat_template`` on a model folder whose tokenizer has none: every prompt fails to
  render (verl drops them all too), on every engine that renders it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stateset_backend.cli import main
from stateset_backend.conformance.samples import parquet_row

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _plan(capsys, tmp_path: Path, doc: dict[str, Any]) -> tuple[int, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc), encoding="utf-8")
    code = main(["plan", "--engine", "verl", "--engine-version", "0.9.1", str(spec), "-o",
                 str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    return code, err.strip()


def _split(tmp_path: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    path = tmp_path / "data" / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return {"uri": "data/rows.parquet", "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


PLAIN = [{"prompt": f"ticket {i} action :", "answer": "billing"} for i in range(64)]


@pytest.mark.parametrize("rows, says", [
    (PLAIN, "'prompt' is string, not chat messages (a list of {role, content}); no "
            "reward_model.ground_truth (the answer verl hands the reward); no "
            "extra_info.prompt (the prompt text the reward is given)"),
    ([{k: v for k, v in parquet_row(r, i).items() if k != "extra_info"}
      for i, r in enumerate(PLAIN)], "no extra_info.prompt (the prompt text the reward is "
                                     "given)"),
])
def test_a_split_verl_cannot_read_is_refused_at_plan_time(capsys, tmp_path, grpo, rows, says):
    grpo["data"]["train"] = _split(tmp_path, rows)
    code, line = _plan(capsys, tmp_path, grpo)
    assert code == 3, line
    assert line.count("\n") == 0 and "data.train: rows.parquet is not in verl's row layout" \
        in line and says in line and "convert the split first" in line, line
    assert not (tmp_path / "p.json").exists()


def test_a_split_in_verls_layout_plans(capsys, tmp_path, grpo):
    grpo["data"]["train"] = _split(tmp_path, [parquet_row(r, i) for i, r in enumerate(PLAIN)])
    code, line = _plan(capsys, tmp_path, grpo)
    assert code == 0, line


def _model(tmp_path: Path, template: str | None) -> str:
    folder = tmp_path / "model"
    shutil.copytree(EXAMPLES / "external" / "models" / "tiny-llama-support", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return "model"


def test_a_chat_template_the_tokenizer_lacks_is_refused(capsys, tmp_path, grpo):
    grpo["model"] = {"path": _model(tmp_path, None), "dtype": "float32"}
    code, line = _plan(capsys, tmp_path, grpo)
    assert code == 2, line
    assert "data.chat_template is true, but the tokenizer in" in line and \
        "has no chat template" in line, line


def test_a_tokenizer_with_a_chat_template_plans(capsys, tmp_path, grpo):
    grpo["model"] = {"path": _model(tmp_path, "{{ messages[0]['content'] }}"),
                     "dtype": "float32"}
    code, line = _plan(capsys, tmp_path, grpo)
    assert code == 0, line
    grpo["data"]["chat_template"] = False
    grpo["model"]["path"] = _model(tmp_path / "other", None) and "other/model"
    code, line = _plan(capsys, tmp_path, grpo)
    assert code in (0, 3), line  # false is verl's to refuse (it always renders), not ours
    assert "has no chat template" not in line
