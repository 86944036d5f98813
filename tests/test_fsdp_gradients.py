"""The sharded update's gradients as ZeRO-2 lays them out (pods_bench/sharding.py), on real gloo
processes: between the passes of an update a process holds only its float32 shard of the gradient;
under bf16 compute the reduce-scattered gradient is exactly the float32 sum of what each process's
bf16 passes computed (a bf16 reduce would round it, and the test sees that), with and without
gradient checkpointing, on three processes and dimensions that do not divide by three."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.test_logprobs import run_on_processes

pytestmark = pytest.mark.slow

# held between passes: the shards of the float32 gradient, a 1/K share (the even split pads a tensor
# by at most K - 1 rows, a few per cent of these small ones), never a whole one
GRADIENT_BYTES = """
import json, torch
from dataclasses import replace
from accelerate import Accelerator
from pods_bench.checkpoint import load_policy
from pods_bench.models import TinyModelConfig
from pods_bench.sharding import gradient_bytes, shard
from pods_bench.update import Learner, update_policy
from tests.test_logprobs import make_cfg, make_sequences
accelerator = Accelerator(cpu=True)
cfg = make_cfg("token", rows_per_pass=1, micro=2)
tiny = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)
cfg = replace(cfg, model=replace(cfg.model, tiny=tiny, mixed_precision="bf16"), optim=replace(cfg.optim, fsdp=True))
policy, tokenizer = load_policy(cfg)
whole = 4 * sum(p.numel() for p in policy.parameters())  # float32 gradient of every parameter
shard(policy, cfg, accelerator.device)
held = []
backward = accelerator.backward
accelerator.backward = lambda loss: (backward(loss), held.append(gradient_bytes(policy)))
optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
share = make_sequences(8)[accelerator.process_index :: 2]
update_policy(Learner(policy, policy, None, optimizer, scheduler, accelerator, tokenizer.pad_token_id), share, cfg)
if accelerator.is_main_process:
    print("RESULT " + json.dumps({"whole": whole, "held": held}))
"""


def test_between_passes_a_process_holds_only_its_gradient_shard(tmp_path):
    """4 passes of one row each on each of 2 processes: after every backward pass the gradient a
    process holds is its half of the float32 gradient (FSDP's no-sync accumulation held the whole)."""
    stdout = run_on_processes(GRADIENT_BYTES, tmp_path, processes=2)
    result = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert len(result["held"]) == 4
    for held in result["held"]:
        assert 0 < held <= 0.5 * result["whole"] * 1.05, (held, result["whole"])


# A reduce-scattered bf16 update against its unsharded reference. Every process runs update_policy on
# its share with FSDP (bf16 compute, float32 shards), an SGD whose step records the whole gradient;
# rank 0 then rebuilds each process's passes on an unsharded model with the same bf16 parameters,
# with the library's own log-prob and loss code, and sums their bf16 gradients in float32.
BF16_GRADIENT = """
import json, sys, torch
from dataclasses import replace
from accelerate import Accelerator
from pods_bench.checkpoint import load_policy
from pods_bench.models import TinyModelConfig
from pods_bench.sharding import shard
from pods_bench.update import Learner, aggregate, completion_logprobs, loss_passes, normaliser, policy_loss_terms, update_policy
from tests.test_logprobs import make_cfg, make_sequences

class Recorder(torch.optim.SGD):
    def step(self, closure=None):
        self.seen = [p.grad.full_tensor().float().flatten() for p in self.param_groups[0]["params"]]

accelerator = Accelerator(cpu=True)
world, rank = accelerator.num_processes, accelerator.process_index
# hidden 44, 1 KV head of 22, MLP 70: no weight's rows divide by 3 (FSDP pads the last shard)
tiny = TinyModelConfig(hidden_size=44, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=70)
sequences = make_sequences(10)
shares = [sequences[r::world] for r in range(world)]
out = {}
for checkpointing, reduce_dtype in json.loads(sys.argv[1]):
    cfg = make_cfg("sequence", rows_per_pass=2, chunk=3, micro=2)
    model_cfg = replace(cfg.model, tiny=tiny, mixed_precision="bf16", gradient_checkpointing=checkpointing)
    cfg = replace(cfg, model=model_cfg, optim=replace(cfg.optim, fsdp=True))
    policy, tokenizer = load_policy(cfg)
    reference, _ = load_policy(cfg)
    shard(policy, cfg, accelerator.device, reduce_dtype=getattr(torch, reduce_dtype))
    optimizer = Recorder(policy.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(policy, policy, None, optimizer, scheduler, accelerator, tokenizer.pad_token_id)
    update_policy(learner, shares[rank], cfg)
    if not accelerator.is_main_process:
        continue
    for p in reference.parameters():  # bf16 parameters as FSDP gathers them; buffers stay as they are
        p.data = p.data.to(torch.bfloat16)
    reference.train()
    calls = []  # calls into a block: two per pass when gradient checkpointing recomputes it in backward
    reference.get_decoder().layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    divide_by = normaliser("sequence", len(sequences), 0, 0) / world
    total = None
    for share in shares:
        for b in loss_passes(share, cfg, tokenizer.pad_token_id, "cpu"):
            reference.zero_grad(set_to_none=True)
            logp = completion_logprobs(reference, b, cfg.sampling.temperature, 3)
            per_token, _, _ = policy_loss_terms(logp, logp.detach(), b["advantages"], None, 0.2, 0.0)
            (aggregate(per_token, b["completion_mask"], "sequence", 0) / divide_by).backward()
            grads = torch.cat([p.grad.float().flatten() for p in reference.parameters()])
            total = grads if total is None else total + grads
    expected = total / world
    got = torch.cat(optimizer.seen)
    passes = sum(len(loss_passes(share, cfg, tokenizer.pad_token_id, "cpu")) for share in shares)
    assert len(calls) == passes * (2 if checkpointing else 1), (len(calls), passes)
    out[f"{checkpointing}/{reduce_dtype}"] = float((got - expected).norm() / expected.norm())
if accelerator.is_main_process:
    print("RESULT " + json.dumps(out))
"""


def test_bf16_sharded_gradient_is_the_float32_sum_of_the_processes_bf16_passes(tmp_path):
    """Three processes, uneven shards, bf16 compute, with and without gradient checkpointing: the
    gradient AdamW would step on equals the unsharded reference to float32 rounding (relative error
    < 1e-5); reducing in bf16 instead (the positive control) is off by bf16 rounding, > 1e-4."""
    cases = [(checkpointing, dtype) for checkpointing in (False, True) for dtype in ("float32", "bfloat16")]
    stdout = run_on_processes(BF16_GRADIENT, tmp_path, json.dumps(cases), processes=3)
    errors = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    for checkpointing in (False, True):
        assert errors[f"{checkpointing}/float32"] < 1e-5, errors
        assert errors[f"{checkpointing}/bfloat16"] > 1e-4, errors


# --- the sharding helpers on one process, in this process (fast, and every call seen by the tests) -------


@pytest.fixture
def one_process_group():
    """A gloo process group of this process alone: the helpers' collective calls run, each shard is whole."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_cfg(precision: str):
    """tests.test_logprobs' tiny config, fully fine-tuned with FSDP, computing in `precision` ("bf16" or "no")."""
    from tests.test_logprobs import make_cfg

    cfg = make_cfg("token")
    return replace(cfg, model=replace(cfg.model, mixed_precision=precision), optim=replace(cfg.optim, fsdp=True))


def test_one_process_shards_gathers_and_hands_back_the_whole_weights_and_optimizer_state(one_process_group):
    """FSDP2 over a one-process gloo group: the shard is the whole tensor, so every helper's answer
    is known without FSDP: the gathered weights are the float32 ones cast to bf16, the gradient held
    is 4 bytes a parameter, the full state dicts are the model's own (the tied output layer named
    once), and AdamW's first moment after one step is (1 - beta1) x the gradient."""
    from types import SimpleNamespace

    import torch

    from pods_bench.checkpoint import load_policy
    from pods_bench.config import uses_fsdp
    from pods_bench.sharding import (
        broadcast_object,
        decoder_layers,
        full_model_state,
        full_optimizer_state,
        gathered,
        gradient_bytes,
        is_sharded,
        load_optimizer_state,
        shard,
        shard_from_rank0,
        total_norm,
        units,
    )

    cfg = sharded_cfg("bf16")
    plain = replace(cfg, optim=replace(cfg.optim, fsdp=False))
    assert (uses_fsdp(cfg, 2), uses_fsdp(cfg, 1), uses_fsdp(plain, 2)) == (True, False, False)
    policy, _ = load_policy(cfg)
    whole = {name: p.detach().clone() for name, p in policy.named_parameters()}
    assert policy.config.tie_word_embeddings and "lm_head.weight" not in whole  # one parameter, two names
    assert not is_sharded(policy) and units(policy) == []
    assert shard(policy, cfg, torch.device("cpu")) is policy
    layers = decoder_layers(policy)
    assert layers == list(policy.model.layers) and len(layers) == 2
    assert is_sharded(policy) and units(policy) == [policy, *layers]  # one unit a layer, one for the rest

    with gathered(policy, SimpleNamespace(samples_from_trainer=False)):  # vLLM: its own weights
        assert all(isinstance(p, torch.distributed.tensor.DTensor) for p in policy.parameters())
    with gathered(policy, SimpleNamespace(samples_from_trainer=True)):
        inside = dict(policy.named_parameters())
        assert all(type(p) is torch.nn.Parameter and p.dtype == torch.bfloat16 for p in inside.values())
        assert all(torch.equal(inside[n], w.to(torch.bfloat16)) for n, w in whole.items())
        policy(torch.tensor([[5, 6, 7]]))  # a forward pass inside keeps them gathered
        assert all(type(p) is torch.nn.Parameter for p in policy.parameters())
    assert {type(p).__name__ for p in policy.parameters()} == {"DTensor"}
    assert {p.dtype for p in policy.parameters()} == {torch.float32}

    assert gradient_bytes(policy) == 0
    policy(torch.tensor([[5, 6, 7, 8]])).logits.float().sum().backward()
    assert gradient_bytes(policy) == 4 * sum(w.numel() for w in whole.values())  # one process: all of it
    grads = {n: p.grad.full_tensor().clone() for n, p in policy.named_parameters()}
    by_hand = float(torch.cat([g.flatten() for g in grads.values()]).double().norm())
    assert total_norm(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1e9)) == pytest.approx(
        by_hand, rel=1e-5
    )  # float32 sums
    assert total_norm(torch.tensor(2.5)) == 2.5

    state = full_model_state(policy)
    assert sorted(state) == sorted(whole) and all(torch.equal(state[n], w) for n, w in whole.items())

    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.1)
    assert full_optimizer_state(policy, optimizer) == optimizer.state_dict()  # no step yet: no state made
    fresh = full_optimizer_state(policy, optimizer)
    optimizer.step()
    saved = full_optimizer_state(policy, optimizer)
    assert sorted(saved["state"]) == sorted(whole)
    for name, g in grads.items():
        assert torch.allclose(saved["state"][name]["exp_avg"], 0.1 * g, rtol=1e-6, atol=0), name

    policy.zero_grad(set_to_none=True)  # as on resume: no gradients yet
    again = torch.optim.AdamW(policy.parameters(), lr=0.1)
    load_optimizer_state(policy, again, fresh)
    assert again.state_dict()["state"] == {}  # saved before the first step: left fresh
    load_optimizer_state(policy, again, saved)
    restored = full_optimizer_state(policy, again)["state"]
    assert all(torch.equal(restored[n]["exp_avg_sq"], saved["state"][n]["exp_avg_sq"]) for n in whole)
    assert broadcast_object({"rank 0": [1, 2]}) == {"rank 0": [1, 2]}

    # built on the meta device and filled from rank 0's whole model: its weights, its rotary buffers
    source, _ = load_policy(cfg)
    source.model.rotary_emb.inv_freq.mul_(3.0)  # a buffer outside the state dict, told apart
    empty, _ = load_policy(cfg, meta=True)
    filled = shard_from_rank0(empty, source, cfg, torch.device("cpu"))
    assert filled is empty and units(filled) == [filled, *decoder_layers(filled)]
    assert all(torch.equal(p.full_tensor(), dict(source.named_parameters())[n]) for n, p in filled.named_parameters())
    assert torch.equal(filled.model.rotary_emb.inv_freq, source.model.rotary_emb.inv_freq)
    source.model.rotary_emb.inv_freq.mul_(2.0)  # rank 0's copy is its own: the whole model can go
    assert torch.equal(2.0 * filled.model.rotary_emb.inv_freq, source.model.rotary_emb.inv_freq)
    assert filled.lm_head.weight is filled.model.embed_tokens.weight  # still tied: one parameter


def test_one_process_float32_compute_and_the_whole_gradient_a_pass_without_reduce_scatter_leaves(one_process_group):
    """model.mixed_precision=no gathers float32 weights. Without the reduce-scatter after a pass (FSDP's
    set_requires_gradient_sync(False): the ZeRO-1 layout the sharded update avoids) a process holds the
    whole float32 gradient, 4 bytes a parameter, and gradient_bytes counts it: on the gathered parameter
    under float32 compute, accumulated in float32 beside it under bf16 compute."""
    from types import SimpleNamespace

    import torch

    from pods_bench.checkpoint import load_policy
    from pods_bench.sharding import gathered, gradient_bytes, shard

    for precision, compute in (("no", torch.float32), ("bf16", torch.bfloat16)):
        cfg = sharded_cfg(precision)
        policy, _ = load_policy(cfg)
        whole = 4 * sum(p.numel() for p in policy.parameters())
        shard(policy, cfg, torch.device("cpu"))
        with gathered(policy, SimpleNamespace(samples_from_trainer=True)):
            assert {p.dtype for p in policy.parameters()} == {compute}, precision
        policy.set_requires_gradient_sync(False)
        policy(torch.tensor([[5, 6, 7, 8]])).logits.float().sum().backward()
        assert gradient_bytes(policy) == whole, precision
