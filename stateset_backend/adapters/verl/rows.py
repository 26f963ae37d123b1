"""The row layout verl's own data pipeline reads, checked at plan time from a local parquet
file's schema (its footer only).

verl's ``RLHFDataset`` applies the chat template to the prompt column as chat messages; a
text prompt reaches ``apply_chat_template`` as a string and every row is filtered out, so the
trainer dies on an empty sampler after the queue wait. verl's reward manager hands the reward
``reward_model.ground_truth``, never the spec's ``answer_field``, and the reward shim passes
the row's ``extra_info.prompt`` as the prompt: without it the spec's reward silently scores
every completion against an empty prompt. A single-turn run on verl therefore needs rows in
verl's layout; found here, the message names the columns to add. (A prompt column the file
lacks altogether is verl's own error when it loads the split, naming the column.)
"""

from __future__ import annotations

from pathlib import Path

LAYOUT = ("verl reads rows as {prompt_field: [{role, content}, ...], "
          "reward_model: {ground_truth}, extra_info: {prompt}}")


def layout_problems(path: Path, prompt_field: str) -> list[str]:
    """What the parquet file at ``path`` lacks of verl's row layout; empty when it has it or
    when its schema cannot be read here (the engine then reports it)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
    except Exception:  # no pyarrow here, or not a parquet file: the launch finds out
        return []

    def field(name: str) -> pa.DataType | None:
        index = schema.get_field_index(name)
        return schema.field(index).type if index >= 0 else None

    def child(parent: pa.DataType | None, name: str) -> pa.DataType | None:
        if parent is None or not pa.types.is_struct(parent):
            return None
        index = parent.get_field_index(name)
        return parent.field(index).type if index >= 0 else None

    problems = []
    prompt = field(prompt_field)
    item = prompt.value_type if prompt is not None and (
        pa.types.is_list(prompt) or pa.types.is_large_list(prompt)) else None
    # a missing prompt column is verl's own loud error when it loads the split, naming it
    if prompt is not None and (child(item, "role") is None or child(item, "content") is None):
        problems.append(f"{prompt_field!r} is {prompt}, not chat messages (a list of "
                        "{role, content})")
    if child(field("reward_model"), "ground_truth") is None:
        problems.append("no reward_model.ground_truth (the answer verl hands the reward)")
    if child(field("extra_info"), "prompt") is None:
        problems.append("no extra_info.prompt (the prompt text the reward is given)")
    return problems
