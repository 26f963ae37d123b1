"""Native against TRL on one recorded batch: the same weights, prompts, completions, rewards,
old and reference log-probs fed to TRL's own ``GRPOTrainer.compute_loss`` and to the native
objective functions. For every objective and aggregation both claim with the same meaning the
loss and every parameter's gradient agree within 1e-5 in float32; what cannot agree (TRL's std
epsilon) is a declared deviation, and the batch uses the spec value TRL hard-codes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from optional_installs import TRL_PLUGIN_MISSING

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl", reason=TRL_PLUGIN_MISSING)

from stateset_backend.native import objectives  # noqa: E402
from stateset_backend.native.model import load_policy  # noqa: E402
from stateset_backend.native.rollout import response_logprobs  # noqa: E402
from stateset_backend.spec.model import Model  # noqa: E402

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)

TOL = 1e-5
GROUP, PROMPTS, T = 4, 2, 5
TRL_STD_EPSILON = 1e-4

# (objective, aggregation, ratio level, TRL loss_type, clip low/high, KL coef, entropy coef)
CASES = [
    ("grpo", "seq_mean_token_mean", "token", "grpo", 0.2, 0.2, 0.04, 0.0),
    ("grpo", "token_mean", "token", "bnpo", 0.2, 0.2, 0.04, 0.01),
    ("dr_grpo", "seq_mean_token_sum_norm", "token", "dr_grpo", 0.2, 0.2, None, 0.0),
    ("dapo", "token_mean", "token", "bnpo", 0.2, 0.28, None, 0.0),
    ("gspo", "seq_mean_token_mean", "sequence", "grpo", 3e-4, 4e-4, None, 0.0),
    ("gspo", "seq_mean_token_sum", "sequence", "luspo", 3e-4, 4e-4, 0.04, 0.0),
    ("cispo", "token_mean", "token", "cispo", 1.0, 0.28, None, 0.0),
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One batch: the tiny model's seeded weights, 2 prompts x 4 completions of 1-5 tokens,
    rewards with an all-equal group member, old and reference log-probs off the policy."""
    model, tokenizer = load_policy(Model(path="builtin:tiny-llama-support", dtype="float32"),
                                   1234, Path("."), torch.device("cpu"))
    folder = tmp_path_factory.mktemp("trl-differential") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    texts = ["ticket : hello it is morgan about the backpack password reset link expired "
             "action :", "ticket : the blender order has not arrived yet action :"]
    enc = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    prompt_ids = enc["input_ids"].repeat_interleave(GROUP, 0)
    prompt_mask = enc["attention_mask"].repeat_interleave(GROUP, 0)
    gen = torch.Generator().manual_seed(7)
    completion_ids = torch.randint(4, tokenizer.vocab_size, (PROMPTS * GROUP, T), generator=gen)
    lengths = torch.tensor([5, 3, 1, 4, 2, 5, 5, 3])
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    rewards = torch.tensor([1.0, 0.1, 0.0, 1.0, 0.1, 0.0, 0.0, 1.0])
    with torch.no_grad():
        logp, _ = response_logprobs(model, prompt_ids, prompt_mask.float(), completion_ids,
                                    completion_mask.float(), 1.0)
    old = logp + 0.3 * torch.randn(logp.shape, generator=gen)
    ref = logp + 0.5 * torch.randn(logp.shape, generator=gen)
    return {"model": model, "tokenizer": tokenizer, "path": str(folder),
            "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
            "completion_ids": completion_ids, "completion_mask": completion_mask,
            "rewards": rewards, "old": old, "ref": ref}


def native_advantages(rewards: Any) -> Any:
    group_ids = torch.arange(PROMPTS).repeat_interleave(GROUP)
    return objectives.advantages(rewards, group_ids, torch.ones_like(rewards), baseline="group",
                                 std_normalize=True, scope="group", unbiased=True,
                                 eps=TRL_STD_EPSILON)


def test_trl_group_advantages_are_the_native_ones_at_trls_epsilon(recorded):
    from trl.trainer.utils import nanstd

    r = recorded["rewards"]
    grouped = r.view(-1, GROUP)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(GROUP)
    std = nanstd(grouped, dim=1).repeat_interleave(GROUP)
    trl_adv = (r - mean) / (std + TRL_STD_EPSILON)  # GRPOTrainer, scale_rewards "group"
    assert torch.allclose(trl_adv, native_advantages(r), atol=1e-6, rtol=0)


def native_loss(model: Any, batch: dict[str, Any], case: tuple[Any, ...]) -> Any:
    objective, agg, _, _, low, high, kl_coef, entropy_coef = case
    mask = batch["completion_mask"].float()
    logp, entropy = response_logprobs(model, batch["prompt_ids"],
                                      batch["prompt_mask"].float(), batch["completion_ids"],
                                      mask, 1.0)
    _, loss_name = objectives.RECIPES[objective]
    pl = objectives.POLICY_LOSSES[loss_name](logp, batch["old"], batch["advantages"], mask,
                                             clip_low=low, clip_high=high)
    loss = objectives.aggregate(pl.loss, mask, agg, T)
    if kl_coef is not None:
        # TRL's k3 has no clamp (a declared deviation); this batch stays far from any clamp
        kl = objectives.kl_estimate(logp, batch["ref"], "k3", None)
        assert float(kl.max()) < 10
        loss = loss + kl_coef * objectives.aggregate(kl, mask, agg, T)
    if entropy_coef:
        loss = loss - entropy_coef * objectives.aggregate(entropy, mask, "token_mean", 1)
    return loss


def trl_loss(batch: dict[str, Any], case: tuple[Any, ...], path: str, tokenizer: Any,
             out_dir: str) -> tuple[Any, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    objective, _, ratio, loss_type, low, high, kl_coef, entropy_coef = case
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to="none",
        per_device_train_batch_size=PROMPTS * GROUP, num_generations=GROUP,
        steps_per_generation=1, gradient_accumulation_steps=1, max_completion_length=T,
        loss_type=loss_type, importance_sampling_level=ratio, epsilon=low,
        epsilon_high=1.0 + high if objective == "cispo" else high,
        beta=0.0 if kl_coef is None else kl_coef, use_bias_correction_kl=False,
        entropy_coef=entropy_coef, scale_rewards="group", temperature=1.0,
        model_init_kwargs={"dtype": "float32"}, gradient_checkpointing=False,
        disable_dropout=False)
    trainer = GRPOTrainer(model=path, reward_funcs=[lambda completions, **kw: [0.0] *
                                                    len(completions)],
                          args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 8),
                          processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": batch["prompt_ids"], "prompt_mask": batch["prompt_mask"],
              "completion_ids": batch["completion_ids"],
              "completion_mask": batch["completion_mask"],
              "advantages": batch["advantages"], "old_per_token_logps": batch["old"],
              "num_items_in_batch": batch["completion_mask"].sum()}
    if kl_coef is not None:
        inputs["ref_per_token_logps"] = batch["ref"]
    loss = trainer.compute_loss(trainer.model, inputs)
    return loss, trainer.model


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_native_objective_equals_trls_compute_loss(recorded, case, tmp_path):
    batch = {**recorded, "advantages": native_advantages(recorded["rewards"])}
    native_model = copy.deepcopy(recorded["model"])
    native_model.train()
    expected = native_loss(native_model, batch, case)
    expected.backward()
    loss, trl_model = trl_loss(batch, case, recorded["path"], recorded["tokenizer"],
                               str(tmp_path))
    loss.backward()
    assert abs(float(loss) - float(expected)) <= TOL, (float(loss), float(expected))
    theirs = dict(trl_model.named_parameters())
    worst = 0.0
    for name, p in native_model.named_parameters():
        assert theirs[name].grad is not None, name
        worst = max(worst, float((theirs[name].grad - p.grad).abs().max()))
    assert worst <= TOL, f"largest gradient difference {worst:.2e}"
