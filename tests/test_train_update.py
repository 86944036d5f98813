"""The policy-gradient update on its own: loss terms, the plain policy gradient on the first update,
micro-batching, LoRA (only the adapter trains) and the KL term against the reference policy."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from pods_bench.checkpoint import load_policy, reference_model
from pods_bench.config import LoraConfig, LossConfig, ModelConfig, OptimConfig, TrainConfig
from pods_bench.models import TinyModelConfig
from pods_bench.update import KeptRollout, Learner, pack, policy_loss_terms, update_policy
from tests.test_logprobs import plain_logprobs

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def make_cfg(**changes) -> TrainConfig:
    cfg = TrainConfig(model=ModelConfig(name="tiny", tiny=SMALL), optim=OptimConfig(lr=1e-3, max_grad_norm=1e9))
    for key, value in changes.items():
        cfg = replace(cfg, **{key: value})
    return cfg


def make_sequences(n: int = 6, seed: int = 0) -> list[KeptRollout]:
    """Rollouts of different prompt and completion lengths with nonzero advantages."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(8, 100, (3 + i % 4,), generator=g).tolist()
        completion = torch.randint(8, 100, (2 + (3 * i) % 7,), generator=g).tolist()
        out.append(KeptRollout(prompt, completion, advantage=float(torch.randn(1, generator=g))))
    return out


def run_update(cfg, sequences, accelerator):
    model, tokenizer = load_policy(cfg)
    before = copy.deepcopy(model.state_dict())
    ref = reference_model(cfg, model) if cfg.loss.beta > 0 else None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.optim.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(model, model, ref, optimizer, scheduler, accelerator, tokenizer.pad_token_id)
    stats = update_policy(learner, sequences, cfg)
    return model, before, stats, learner


def test_loss_terms():
    logp = torch.tensor([[-1.0, -2.0]])
    adv = torch.tensor([2.0])
    loss, kl, clipped = policy_loss_terms(logp, logp, adv, None, clip_eps=0.2, beta=0.0)
    assert torch.equal(loss, torch.tensor([[-2.0, -2.0]])) and kl is None and not clipped.any()  # ratio 1: -A
    # ratio e^0.5 > 1.2 with A > 0: the clipped term (1.2 A) is the smaller objective
    loss, _, clipped = policy_loss_terms(logp, logp - 0.5, adv, None, clip_eps=0.2, beta=0.0)
    assert torch.allclose(loss, torch.tensor([[-2.4, -2.4]])) and clipped.all()
    # with A < 0 the unclipped term wins: -(e^0.5 * -2)
    loss, _, clipped = policy_loss_terms(logp, logp - 0.5, -adv, None, clip_eps=0.2, beta=0.0)
    assert torch.allclose(loss, torch.full((1, 2), 2 * math.exp(0.5))) and not clipped.any()
    # k3: exp(d) - d - 1 with d = ref - logp; zero when equal, positive otherwise
    _, kl, _ = policy_loss_terms(logp, logp, adv, logp, clip_eps=0.2, beta=0.1)
    assert torch.equal(kl, torch.zeros(1, 2))
    loss, kl, _ = policy_loss_terms(logp, logp, adv, logp + 0.3, clip_eps=0.2, beta=0.1)
    assert torch.allclose(kl, torch.full((1, 2), math.exp(0.3) - 1.3))
    assert torch.allclose(loss, -2.0 + 0.1 * kl)


@pytest.mark.parametrize("aggregation", ["sequence", "token"])
def test_first_update_is_the_plain_policy_gradient_whatever_the_micro_batches(aggregation, accelerator):
    sequences = make_sequences()
    # reference: the gradient of -1/N sum_i A_i mean_t log pi(o_it)  (sequence), or of
    # -1/T sum_it A_i log pi(o_it)  (token), from one full-batch forward pass
    cfg = make_cfg(loss=LossConfig(aggregation=aggregation))
    model, tokenizer = load_policy(cfg)
    batch = pack(sequences, tokenizer.pad_token_id, "cpu")
    logp = plain_logprobs(model, batch, cfg.sampling.temperature)
    mask = batch["completion_mask"]
    weighted = torch.where(mask, logp * batch["advantages"].unsqueeze(1), 0.0)
    if aggregation == "sequence":
        objective = (weighted.sum(1) / mask.sum(1)).mean()
        surrogate = -batch["advantages"].mean()  # the loss's value: ratio 1, so -mean_i A_i
    else:
        objective = weighted.sum() / mask.sum()
        surrogate = -(batch["advantages"] * mask.sum(1)).sum() / mask.sum()
    (-objective).backward()
    expected_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()

    for micro_batch_size in (1, 4, 16):
        cfg = make_cfg(
            loss=LossConfig(aggregation=aggregation),
            optim=OptimConfig(lr=1e-3, max_grad_norm=1e9, micro_batch_size=micro_batch_size),
        )
        _, _, stats, _ = run_update(cfg, sequences, accelerator)
        assert stats["grad_norm"] == pytest.approx(expected_norm, rel=1e-4), micro_batch_size
        assert stats["loss"] == pytest.approx(surrogate.item(), abs=1e-5)
        assert stats["clipped"] == 0 and stats["lr"] == 1e-3


def test_full_fine_tuning_changes_the_weights(accelerator):
    model, before, stats, _ = run_update(make_cfg(), make_sequences(), accelerator)
    after = model.state_dict()
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0
    assert all(not torch.equal(before[k], after[k]) for k in before if "norm" not in k)


def test_lora_trains_only_the_adapter(accelerator):
    cfg = make_cfg(lora=LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]))
    sequences = make_sequences()
    model, before, _, learner = run_update(cfg, sequences, accelerator)
    update_policy(learner, sequences, cfg)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    # after two steps both factors move (B starts at zero, so A's first gradient is zero)
    assert any("lora_A" in k for k in changed) and any("lora_B" in k for k in changed)
    assert all("lora_" not in k for k in set(before) - changed)


@pytest.mark.parametrize("lora", [False, True])
def test_kl_to_the_initial_policy(lora, accelerator):
    cfg = make_cfg(
        loss=LossConfig(beta=0.1),
        lora=LoraConfig(enabled=lora, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]),
        optim=OptimConfig(lr=1e-2, max_grad_norm=1e9),
    )
    sequences = make_sequences()
    model, _, first, learner = run_update(cfg, sequences, accelerator)
    assert (learner.ref_model is None) == lora  # LoRA: the reference is the base model with adapters disabled
    assert first["kl_sum"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first step
    second = update_policy(learner, sequences, cfg)
    assert second["kl_sum"] > 1e-6 and math.isfinite(second["loss"])


def test_several_updates_per_batch_clip_the_ratio(accelerator):
    cfg = make_cfg(optim=OptimConfig(lr=3e-2, max_grad_norm=1e9, updates_per_batch=3), loss=LossConfig(clip_eps=0.05))
    model, before, stats, _ = run_update(cfg, make_sequences(), accelerator)
    assert stats["clipped"] > 0  # later updates move the policy away from pi_old
    assert math.isfinite(stats["loss"])


def test_nothing_to_train_on_is_a_no_op(accelerator):
    model, before, stats, _ = run_update(make_cfg(), [], accelerator)
    assert stats["loss"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("micro_batch_size", [2, 4])
def test_micro_batch_token_mean_is_the_mean_of_each_micro_batch_token_mean(micro_batch_size, accelerator):
    """TRL's "bnpo" (the paper's 8-GPU runs): each micro-batch's loss is the mean over its own tokens,
    and the step's gradient is the mean over micro-batches, so the micro-batch size changes the update."""
    sequences = make_sequences()
    cfg = make_cfg(
        loss=LossConfig(aggregation="micro_batch_token"),
        optim=OptimConfig(lr=1e-3, max_grad_norm=1e9, micro_batch_size=micro_batch_size),
    )
    model, tokenizer = load_policy(cfg)
    chunks = [sequences[i : i + micro_batch_size] for i in range(0, len(sequences), micro_batch_size)]
    objective = 0.0
    for chunk in chunks:
        batch = pack(chunk, tokenizer.pad_token_id, "cpu")
        logp = plain_logprobs(model, batch, cfg.sampling.temperature)
        mask = batch["completion_mask"]
        objective = objective + torch.where(mask, logp * batch["advantages"].unsqueeze(1), 0.0).sum() / mask.sum()
    (-(objective / len(chunks))).backward()
    expected_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    _, _, stats, _ = run_update(cfg, sequences, accelerator)
    assert stats["grad_norm"] == pytest.approx(expected_norm, rel=1e-4)
    # not the step-wide token mean: that one would not depend on how the step is cut
    _, _, token_stats, _ = run_update(replace(cfg, loss=LossConfig(aggregation="token")), sequences, accelerator)
    assert token_stats["grad_norm"] != pytest.approx(stats["grad_norm"], rel=1e-3)


@pytest.mark.parametrize("divide", [True, False])
def test_log_probs_with_or_without_the_sampling_temperature(divide, accelerator):
    """TRL 0.14 (the paper's single-GPU runs) took log-probs of the raw logits; the update follows
    `loss.divide_logits_by_temperature`."""
    sequences = make_sequences()
    cfg = make_cfg(loss=LossConfig(divide_logits_by_temperature=divide))
    cfg = replace(cfg, sampling=replace(cfg.sampling, temperature=0.5))
    model, tokenizer = load_policy(cfg)
    batch = pack(sequences, tokenizer.pad_token_id, "cpu")
    logp = plain_logprobs(model, batch, 0.5 if divide else 1.0)
    mask = batch["completion_mask"]
    weighted = torch.where(mask, logp * batch["advantages"].unsqueeze(1), 0.0)
    (-(weighted.sum(1) / mask.sum(1)).mean()).backward()
    expected_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
    _, _, stats, _ = run_update(cfg, sequences, accelerator)
    assert stats["grad_norm"] == pytest.approx(expected_norm, rel=1e-4)
