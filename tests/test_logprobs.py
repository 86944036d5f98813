"""Log-probs taken chunk by chunk through the output layer (pods_bench/logprobs.py) and updates split
into row passes (optim.rows_per_pass), against the textbook formula on the full float32 logits:
the same log-probs, and the same update gradient for every loss aggregation, on one process and on
two (gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pods_bench.checkpoint import load_policy
from pods_bench.config import LossConfig, ModelConfig, OptimConfig, TrainConfig
from pods_bench.models import TinyModelConfig
from pods_bench.update import KeptRollout, Learner, completion_logprobs, pack, update_policy

SMALL = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)
AGGREGATIONS = ["sequence", "token", "micro_batch_token"]
# (rows_per_pass, logprob_chunk_tokens): the whole micro-batch at once, one row and 3 tokens at a
# time, and passes and chunks that do not divide the batch evenly
SPLITS = [(None, 4096), (1, 3), (3, 7)]


def plain_logprobs(model, batch: dict, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) gathered at the completion tokens, from every position's logits:
    written out here, independently of the code under test."""
    mask = batch["attention_mask"]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
    ).logits
    width = batch["completion_ids"].shape[1]
    logp = torch.log_softmax(logits[:, -width - 1 : -1].float() / temperature, dim=-1)
    picked = logp.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return torch.where(batch["completion_mask"], picked, 0.0)


def make_sequences(n: int = 7, seed: int = 0) -> list[KeptRollout]:
    g = torch.Generator().manual_seed(seed)
    return [
        KeptRollout(
            torch.randint(8, 100, (3 + i % 4,), generator=g).tolist(),
            torch.randint(8, 100, (2 + (3 * i) % 7,), generator=g).tolist(),
            float(torch.randn(1, generator=g)),
        )
        for i in range(n)
    ]


def make_cfg(aggregation: str, rows_per_pass=None, chunk: int = 1024, micro: int = 4) -> TrainConfig:
    cfg = TrainConfig(
        model=ModelConfig(name="tiny", tiny=SMALL),
        optim=OptimConfig(
            lr=1.0, max_grad_norm=1e9, micro_batch_size=micro, rows_per_pass=rows_per_pass, logprob_chunk_tokens=chunk
        ),
        loss=LossConfig(aggregation=aggregation),
    )
    return replace(cfg, sampling=replace(cfg.sampling, temperature=0.7))


def reference_gradient(cfg: TrainConfig, sequences: list[KeptRollout]) -> torch.Tensor:
    """The gradient of the first update's loss (ratio 1: -A_i grad log pi), built by hand from the
    plain log-probs of whole micro-batches."""
    model, tokenizer = load_policy(cfg)
    size = cfg.optim.micro_batch_size
    micro = [pack(sequences[i : i + size], tokenizer.pad_token_id, "cpu") for i in range(0, len(sequences), size)]
    total_tokens = sum(len(s.completion_ids) for s in sequences)
    objective = 0.0
    for b in micro:
        mask = b["completion_mask"]
        weighted = plain_logprobs(model, b, cfg.sampling.temperature) * b["advantages"].unsqueeze(1)
        if cfg.loss.aggregation == "sequence":  # mean over sequences of each one's token mean
            objective = objective + (weighted.sum(1) / mask.sum(1)).sum() / len(sequences)
        elif cfg.loss.aggregation == "token":  # mean over every token of the step
            objective = objective + weighted.sum() / total_tokens
        else:  # mean over micro-batches of each one's token mean
            objective = objective + weighted.sum() / mask.sum() / len(micro)
    (-objective).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def update_gradient(cfg: TrainConfig, sequences: list[KeptRollout], accelerator) -> torch.Tensor:
    """The gradient update_policy applied (all-reduced by DDP with several processes), read off one
    SGD step with learning rate 1."""
    policy, tokenizer = load_policy(cfg)
    before = torch.cat([p.detach().flatten() for p in policy.parameters()]).clone()
    model = accelerator.prepare(policy) if accelerator.num_processes > 1 else policy
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    learner = Learner(model, policy, None, optimizer, scheduler, accelerator, tokenizer.pad_token_id)
    update_policy(learner, sequences, cfg)
    return before - torch.cat([p.detach().flatten() for p in policy.parameters()])


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_log_probs_equal_the_full_logits_formula(chunk):
    cfg = make_cfg("sequence")
    model, tokenizer = load_policy(cfg)
    batch = pack(make_sequences(), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        expected = plain_logprobs(model, batch, 0.7)
        got = completion_logprobs(model, batch, 0.7, chunk_tokens=chunk)
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert torch.allclose(got, expected, atol=1e-5)
    assert (got[~batch["completion_mask"]] == 0).all() and (got[batch["completion_mask"]] < 0).all()
    # the output layer is back to itself afterwards: the model still returns logits
    with torch.no_grad():
        assert model(input_ids=batch["input_ids"]).logits.shape[-1] == model.config.vocab_size


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_update_gradient_is_the_same_whatever_the_passes_and_chunks(aggregation, accelerator):
    sequences = make_sequences()
    expected = reference_gradient(make_cfg(aggregation), sequences)
    assert expected.norm() > 0
    for rows_per_pass, chunk in SPLITS:
        got = update_gradient(make_cfg(aggregation, rows_per_pass, chunk), sequences, accelerator)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6), (rows_per_pass, chunk)
    # positive control: another micro-batch size is another loss under micro_batch_token, and the
    # comparison above would see it
    if aggregation == "micro_batch_token":
        other = update_gradient(make_cfg(aggregation, micro=2), sequences, accelerator)
        assert not torch.allclose(other, expected, rtol=1e-3)


TWO_PROCESS_UPDATE = """
import json, sys, torch
from accelerate import Accelerator
from tests.test_logprobs import make_cfg, make_sequences, update_gradient
accelerator = Accelerator(cpu=True)
sequences = make_sequences()
share = sequences[accelerator.process_index :: accelerator.num_processes]  # 4 and 3 sequences
out = {}
for aggregation, rows_per_pass, chunk in json.loads(sys.argv[1]):
    # with rows_per_pass 1 the processes run 4 and 3 passes: the one with fewer pads with a zero-loss pass
    grad = update_gradient(make_cfg(aggregation, rows_per_pass, chunk, micro=2), share, accelerator)
    out[f"{aggregation}/{rows_per_pass}/{chunk}"] = grad.tolist()
if accelerator.is_main_process:
    print("RESULT " + json.dumps(out))
"""


TWO_PROCESS_CASES = [(a, r, c) for a in AGGREGATIONS for r, c in [(None, 4096), (1, 3)]]


def run_on_two_processes(script: str, tmp_path: Path, *args: str) -> str:
    """stdout of `script` run as two gloo processes (torchrun) from the project root."""
    return run_on_processes(script, tmp_path, *args, processes=2)


def run_on_processes(script: str, tmp_path: Path, *args: str, processes: int) -> str:
    """stdout of `script` run as `processes` gloo processes (torchrun) from the project root."""
    from tests.test_multiprocess import ENV, free_port

    path = tmp_path / f"{processes}_processes.py"
    path.write_text(script)
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    command += ["--master_port", str(free_port()), str(path), *args]
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=root, env={**ENV, "PYTHONPATH": str(root)}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def check_whole_batch_gradients(stdout: str) -> None:
    """The RESULT line of a two-process update script against the hand-built gradient of the whole
    batch. Rank 0 held sequences 0, 2, 4, 6 and rank 1 held 1, 3, 5; under micro_batch_token the whole
    batch is the processes' micro-batches of 2 (2 + 2 on one process, 2 + 1 on the other)."""
    results = json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])
    sequences = make_sequences()
    shares = [sequences[0::2], sequences[1::2]]
    for aggregation, rows_per_pass, chunk in TWO_PROCESS_CASES:
        if aggregation == "micro_batch_token":
            micro = [share[i : i + 2] for share in shares for i in range(0, len(share), 2)]
            expected = reference_gradient(make_cfg(aggregation, micro=2), [s for m in micro for s in m])
        else:
            expected = reference_gradient(make_cfg(aggregation), sequences)
        got = torch.tensor(results[f"{aggregation}/{rows_per_pass}/{chunk}"])
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-6), (aggregation, rows_per_pass, chunk)


@pytest.mark.slow
def test_two_processes_give_the_gradient_of_the_whole_batch(tmp_path):
    """Each process updates on its share of the sequences; the all-reduced (DDP) gradient is the
    gradient of the whole batch's loss, with passes and chunks or without."""
    check_whole_batch_gradients(run_on_two_processes(TWO_PROCESS_UPDATE, tmp_path, json.dumps(TWO_PROCESS_CASES)))
