"""SFT on the native engine: the answer-only loss by hand, packed equals padded, the batch
check, exact resume, and the spec shape that keeps RL settings out of an SFT experiment."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from stateset_backend.common.errors import InvalidInput
from stateset_backend.native import checkpoint
from stateset_backend.native.batch import BatchIntegrityError
from stateset_backend.native.objectives import AGGREGATIONS
from stateset_backend.native.sft.objective import SFTExample, check_sft_batch, lay_out, sft_loss
from stateset_backend.native.sft.trainer import SFTTrainer, trainer_for
from stateset_backend.native.trainer import RunSettings
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.files import parse_spec

from .conftest import EXAMPLES

ROWS = [SFTExample(0, [1, 2, 3], [4, 5]), SFTExample(1, [6], [7]),
        SFTExample(2, [8, 9], [10, 11, 12])]


def sft_doc(tiny, layout: str = "padded", **changes):
    doc = tiny(**changes)
    doc["algorithm"] = {"objective": "sft", "sft": {"layout": layout}}
    doc["budget"] = {"total_updates": 4, "prompts_per_update": 8}
    doc["optim"]["lr"] = 3e-3
    doc["checkpoint"] = {"every": 2, "keep": None}
    doc["evaluation"] = {"every": 2, "select_by": "val/reward/mean"}
    return doc


@pytest.fixture
def make_sft(tmp_path):
    def make(doc, out: str = "out") -> SFTTrainer:
        spec = parse_spec(doc)
        (tmp_path / out).mkdir(exist_ok=True)
        trainer = trainer_for(RunSettings("20260101T000000Z-00000000", experiment_digest(spec),
                                          spec, EXAMPLES), tmp_path / out)
        assert isinstance(trainer, SFTTrainer)
        return trainer

    return make


class Bigram(torch.nn.Module):
    """logits[t] depend on token t alone: every token's loss is computable by hand."""

    def __init__(self, vocab: int = 16) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=torch.Generator()
                                                    .manual_seed(0)))

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return type("Out", (), {"logits": self.table[input_ids]})()


def _by_hand(model: Bigram, rows: list[SFTExample]) -> list[list[float]]:
    """Each answer token's NLL given the token before it: the prompt's last token for the first."""
    logp = torch.log_softmax(model.table.detach(), dim=-1)
    out = []
    for row in rows:
        ids = row.prompt_ids + row.answer_ids
        start = len(row.prompt_ids)
        out.append([-float(logp[ids[t - 1], ids[t]]) for t in range(start, len(ids))])
    return out


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_the_loss_is_the_answer_tokens_nll_by_hand(layout, aggregation):
    model = Bigram()
    batch = lay_out(ROWS, layout, pad_id=0, capacity=8)
    check_sft_batch(batch, vocab_size=16)
    per_row = _by_hand(model, ROWS)
    tokens = [x for row in per_row for x in row]
    expected = {
        "token_mean": sum(tokens) / len(tokens),
        "seq_mean_token_mean": sum(sum(r) / len(r) for r in per_row) / len(per_row),
        "seq_mean_token_sum": sum(sum(r) for r in per_row) / len(per_row),
        "seq_mean_token_sum_norm": sum(tokens) / (len(per_row) * 4),
    }[aggregation]
    loss, _ = sft_loss(model, batch, aggregation, max_tokens=4)
    assert math.isclose(float(loss.detach()), expected, rel_tol=1e-6)


def test_prompt_tokens_never_reach_the_loss():
    """Changing what the model predicts for every prompt token leaves the loss unchanged."""
    model = Bigram()
    batch = lay_out(ROWS, "packed", pad_id=0, capacity=8)
    before, _ = sft_loss(model, batch, "token_mean", 4)
    before.backward()
    grad = model.table.grad
    assert grad is not None
    # rows of the table used to predict a prompt token's successor inside the prompt
    inside_prompt = {r.prompt_ids[t] for r in ROWS for t in range(len(r.prompt_ids) - 1)}
    assert inside_prompt and all(float(grad[i].abs().sum()) == 0.0 for i in inside_prompt)
    assert int(batch.is_answer.sum()) == sum(len(r.answer_ids) for r in ROWS)


def test_packing_puts_rows_together_and_padding_does_not():
    padded = lay_out(ROWS, "padded", pad_id=0, capacity=8)
    packed = lay_out(ROWS, "packed", pad_id=0, capacity=8)
    assert padded.input_ids.shape == (3, 5)
    assert packed.input_ids.shape == (2, 7)  # rows 0 and 1 share a sequence (5 + 2 <= 8)
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 0, 1]
    assert packed.segment_ids[0].tolist() == [0, 0, 0, 0, 0, 1, 1]
    mask = packed.attention_mask[0, 0]
    assert not bool(mask[5, :5].any()) and bool(mask[6, 5])  # row 1 never sees row 0


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
def test_packed_and_padded_give_the_same_loss_and_gradient(aggregation):
    from stateset_backend.native.model import load_policy
    from stateset_backend.spec.model import Model

    model, _ = load_policy(Model(path="builtin:tiny-llama-support", dtype="float32"), 0,
                           Path("."), torch.device("cpu"))
    grads = []
    losses = []
    for layout in ("padded", "packed"):
        model.zero_grad()
        loss, _ = sft_loss(model, lay_out(ROWS, layout, pad_id=0, capacity=8), aggregation, 4)
        loss.backward()
        losses.append(float(loss))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert math.isclose(losses[0], losses[1], rel_tol=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.parametrize("tamper, reason", [
    (lambda b: b.is_answer.__setitem__((0, 2), True), "mask"),
    (lambda b: b.answer_at.__setitem__((0, 0), 1), "not marked as an answer"),
    (lambda b: b.position_ids.__setitem__((0, 3), 7), "positions"),
    (lambda b: b.input_ids.__setitem__((1, 0), 99), "vocabulary"),
])
def test_a_tampered_batch_is_refused(tamper, reason):
    batch = lay_out(ROWS, "packed", pad_id=0, capacity=8)
    tamper(batch)
    with pytest.raises(BatchIntegrityError, match=reason):
        check_sft_batch(batch, vocab_size=16)


def test_rl_settings_are_refused_in_an_sft_spec(tiny):
    doc = sft_doc(tiny)
    assert parse_spec(doc).algorithm.group_size == 1
    for key, value in (("group_size", 8), ("kl", {"coef": 0.1}), ("clip", {"low": 0.1,
                                                                           "high": 0.3})):
        bad = json.loads(json.dumps(doc))
        bad["algorithm"][key] = value
        with pytest.raises(InvalidInput, match=f"algorithm.{key} applies to RL objectives"):
            parse_spec(bad)
    rl = tiny()
    rl["algorithm"]["sft"] = {"layout": "packed"}
    with pytest.raises(InvalidInput, match=r"algorithm\.sft applies to sft only"):
        parse_spec(rl)


def test_the_layout_is_part_of_the_experiment(tiny):
    assert experiment_digest(parse_spec(sft_doc(tiny, "padded"))) != \
        experiment_digest(parse_spec(sft_doc(tiny, "packed")))


@pytest.mark.slow
def test_sft_trains_validates_and_resumes_exactly(tiny, make_sft):
    doc = sft_doc(tiny, "packed")
    straight = make_sft(doc, "straight")
    straight.train()
    rows = [json.loads(x) for x in straight.out.metrics.read_text().splitlines()]
    updates = [r for r in rows if r["step"] > 0]
    assert updates[-1]["loss/sft"] < updates[0]["loss/sft"]
    assert {"loss/sft", "token_accuracy", "grad_norm", "lr"} <= set(updates[0])
    assert [r["step"] for r in rows if "val/loss" in r] == [0, 2, 4]
    assert all("val/reward/mean" in r for r in rows if "val/loss" in r)
    receipts = [json.loads(x) for x in straight.out.receipts.read_text().splitlines()]
    assert all(len(r["rows"]) == 8 and r["layout"] == "packed" for r in receipts)
    interrupted = make_sft(doc, "interrupted")
    interrupted.train(until=2)
    resumed = make_sft(doc, "resumed")
    resumed.resume(interrupted.out.checkpoints / "update-000002")
    resumed.train()
    a = checkpoint.trainable_state(straight.model)
    b = checkpoint.trainable_state(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert straight.out.receipts.read_text().splitlines()[2:] == \
        resumed.out.receipts.read_text().splitlines()
