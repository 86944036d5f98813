"""Full fine-tuning keeps float32 master weights with bf16 compute. The paper's 8-GPU runs used
DeepSpeed ZeRO-2 with bf16 (fp32 master weights in the optimizer); AdamW applied to bf16 weights
loses every step smaller than half a bf16 ulp, which at lr 5e-6 is most of them."""

from __future__ import annotations

import copy

import pytest
import torch

from pods_bench.checkpoint import load_policy
from pods_bench.config import ModelConfig, OptimConfig, TrainConfig, config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.models import TinyModelConfig
from pods_bench.update import Learner, make_optimizer, update_policy
from tests.test_train_update import make_sequences
from tests.tiny_runs import tiny_run

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
STEPS = 3


def share_of_weights_changed(dtype: str) -> float:
    """Three AdamW steps at lr 5e-6 under bf16 autocast; the share of matrix entries that moved."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # the process-wide state may hold another test's precision
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    cfg = TrainConfig(
        model=ModelConfig(name="tiny", tiny=SMALL, dtype=dtype, mixed_precision="bf16"),
        optim=OptimConfig(lr=5e-6, max_grad_norm=1e9, micro_batch_size=4),
    )
    model, tokenizer = load_policy(cfg)
    before = copy.deepcopy(model.state_dict())
    prepared = accelerator.prepare(model)
    optimizer = make_optimizer(prepared, cfg, world=1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(prepared, model, None, optimizer, scheduler, accelerator, tokenizer.pad_token_id)
    for step in range(STEPS):
        update_policy(learner, make_sequences(8, seed=step), cfg)
    after = model.state_dict()
    AcceleratorState._reset_state(True)
    matrices = [k for k, v in before.items() if v.dim() == 2]
    changed = sum(int((before[k] != after[k]).sum()) for k in matrices)
    return changed / sum(before[k].numel() for k in matrices)


def test_float32_master_weights_with_bf16_compute_take_every_small_step():
    assert share_of_weights_changed("float32") > 0.99


def test_bf16_weights_would_lose_most_small_steps():
    """The control that shows the check above can fail: the same update on bf16 weights."""
    assert share_of_weights_changed("bfloat16") < 0.5


def test_full_fine_tuning_of_low_precision_weights_is_refused(tmp_path):
    with pytest.raises(PodsBenchError, match="full fine-tuning keeps float32 master weights"):
        config_from_dict(tiny_run(tmp_path, model={"dtype": "bfloat16"}))
    # LoRA trains float32 adapters over a frozen base, which may be bf16
    config_from_dict(tiny_run(tmp_path, model={"dtype": "bfloat16"}, lora={"enabled": True}))
