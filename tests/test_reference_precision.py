"""With the KL term and full fine-tuning, the frozen reference model computes as the policy does:
under the run's bf16 autocast when the policy keeps float32 master weights with bf16 compute.
Before the first step both hold the same weights, so the KL starts from exactly 0 only then."""

from __future__ import annotations

import torch

from pods_bench.config import LossConfig, ModelConfig, OptimConfig, TrainConfig
from pods_bench.models import TinyModelConfig
from pods_bench.update import completion_logprobs, make_learner, pack, reference_logprobs, update_policy
from tests.test_train_update import make_sequences

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


def test_the_reference_model_runs_under_the_policys_autocast():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # the process-wide state may hold another test's precision
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        cfg = TrainConfig(
            model=ModelConfig(name="tiny", tiny=SMALL, dtype="float32", mixed_precision="bf16"),
            loss=LossConfig(beta=0.1),
            optim=OptimConfig(lr=1e-3, max_grad_norm=1e9),
        )
        learner, tokenizer = make_learner(cfg, accelerator, None)
        assert learner.ref_model is not None
        sequences = make_sequences()
        batch = pack(sequences, tokenizer.pad_token_id, accelerator.device)
        with torch.no_grad():
            policy = completion_logprobs(learner.model, batch, 1.0)  # the prepared model: under autocast
            float32 = completion_logprobs(learner.ref_model, batch, 1.0)  # the copy on its own
        reference = reference_logprobs(learner.policy, learner.ref_model, batch, 1.0, 1024)
        assert torch.equal(reference, policy)
        mask = batch["completion_mask"]
        assert (float32 - policy)[mask].abs().max() > 1e-5  # bf16 rounding: what the copy computed on its own
        assert update_policy(learner, sequences, cfg)["kl_sum"] == 0.0
    finally:
        AcceleratorState._reset_state(True)
