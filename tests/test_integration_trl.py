"""GRPO-PODS inside TRL's GRPOTrainer (pods_bench/integrations/trl.py), on the smoke model with
pods-bench's math-verify reward: (a) the kept completions are the subset the selection rule picks on
the rewards TRL computed, and for max-variance the best of every m-subset (brute force); (b) TRL's loss
on the kept batch has pods-bench's own update's gradient on the same kept rollouts; (c) real steps
train, logging what was generated and what was not trained. trl is the `bench` extra (`make test`
installs it, pinned, as `make bench-peer-deps` does)."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("trl", reason="trl is the bench extra: `make bench-peer-deps`")

from pods_bench.config import config_from_dict  # noqa: E402
from pods_bench.errors import PodsBenchError  # noqa: E402
from pods_bench.rewards import RewardFunction  # noqa: E402
from pods_bench.selection import group_advantages, select  # noqa: E402

PROMPTS, N, M = 2, 8, 4


@pytest.fixture(scope="module")
def setup(smoke_model_dir, tmp_path_factory):
    """(trainer factory, the rendered prompts and golds, the tokenizer, the grader)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig

    from pods_bench.integrations.trl import PODSGRPOTrainer
    from pods_bench.sampling import load_training_prompts

    torch.manual_seed(0)
    cfg = config_from_dict({"task": {"name": "arith", "system_prompt": ""}, "budget": {"max_steps": 1}})
    tokenizer = PreTrainedTokenizerFast.from_pretrained(smoke_model_dir)
    tokenizer.padding_side = "left"
    problems, prompts, _ = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
    count = PROMPTS * 4
    dataset = Dataset.from_dict({"prompt": prompts[:count], "gold": [p.gold for p in problems[:count]]})
    grader = RewardFunction(config_from_dict({"reward": {"workers": 1}, "budget": {"max_steps": 1}}).reward)
    drop = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def reward(prompts, completions, completion_ids, gold, **kwargs):
        # the text pods-bench's engine decodes: the char tokenizer's answer tags are special tokens
        texts = [
            tokenizer.decode([t for t in ids if t not in drop], skip_special_tokens=False) for ids in completion_ids
        ]
        return list(grader(texts, gold).total)

    def make(steps: int = 1, **pods):
        args = GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("trl")),
            per_device_train_batch_size=PROMPTS * N,
            num_generations=N,
            max_completion_length=24,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="grpo",
            learning_rate=1e-3,
            max_grad_norm=1e9,
            max_steps=steps,
            shuffle_dataset=False,
            bf16=False,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            logging_steps=1,
            disable_tqdm=True,
            seed=0,
        )
        model = AutoModelForCausalLM.from_pretrained(smoke_model_dir)
        return PODSGRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            **({"pods_m": M} | pods),
        )

    yield make, dataset, tokenizer
    grader.close()


def generation_batch(dataset) -> list[dict]:
    """TRL's layout: each prompt's row repeated n times, consecutively."""
    return [dict(row) for row in dataset.select(range(PROMPTS)) for _ in range(N)]


def test_the_kept_completions_are_the_rules_choice_and_the_max_variance_subset(setup, monkeypatch):
    from trl import GRPOTrainer

    make, dataset, _ = setup
    trainer = make()
    trainer.model.train()
    full = {}  # TRL's own output: every row
    generate = GRPOTrainer._generate_and_score_completions
    monkeypatch.setattr(
        GRPOTrainer, "_generate_and_score_completions", lambda self, x: full.update(generate(self, x)) or full
    )
    kept = trainer._generate_and_score_completions(generation_batch(dataset))
    rewards = trainer._pods_rewards[:, 0].view(PROMPTS, N)
    assert (rewards.amax(1) > rewards.amin(1)).any(), "no mixed group: the check would be vacuous"
    idx = select("max_variance", rewards, M)
    rows = (torch.arange(PROMPTS).unsqueeze(1) * N + idx).flatten()
    assert kept["completion_ids"].shape[0] == PROMPTS * M
    assert torch.equal(kept["completion_ids"], full["completion_ids"][rows])
    assert torch.equal(kept["prompt_ids"], full["prompt_ids"][rows])
    # advantages over the kept m of each prompt, not over the n
    assert torch.allclose(kept["advantages"], group_advantages(rewards.gather(1, idx), eps=1e-4).flatten())
    # independent of pods_bench.selection: no other m-subset of a group has a larger variance
    for p in range(PROMPTS):
        best = max(torch.var(rewards[p, list(s)]).item() for s in itertools.combinations(range(N), M))
        assert torch.var(rewards[p, idx[p]]).item() == pytest.approx(best, abs=1e-9)
    assert kept["num_items_in_batch"] == kept["completion_mask"].sum()


def test_the_loss_on_the_kept_rows_has_pods_benchs_gradient(setup, smoke_model_dir):
    """TRL's loss_type "grpo" on the kept batch and pods-bench's update (update_policy, "sequence"
    aggregation) on the same kept rollouts, from the same weights: the same gradient."""
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, get_scheduler

    from pods_bench.update import KeptRollout, Learner, update_policy

    make, dataset, tokenizer = setup
    trainer = make()
    trainer.model.train()
    before = AutoModelForCausalLM.from_pretrained(smoke_model_dir)  # the weights TRL's step starts from
    kept = trainer._generate_and_score_completions(generation_batch(dataset))
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets before its first step
    trainer.compute_loss(trainer.model, kept).backward()
    trl_grads = [p.grad.clone() for p in trainer.model.parameters()]

    class GradientRecorder(torch.optim.SGD):  # lr 0: records the update's gradient, moves nothing
        def step(self, closure=None):
            self.grads = [p.grad.clone() for group in self.param_groups for p in group["params"]]

    optimizer = GradientRecorder(list(before.parameters()), lr=0.0)
    accelerator = Accelerator(cpu=True)
    learner = Learner(
        before, before, None, optimizer, get_scheduler("constant", optimizer), accelerator, tokenizer.pad_token_id
    )
    rollouts = [
        KeptRollout(ids[mask.bool()].tolist(), c_ids[c_mask.bool()].tolist(), float(a))
        for ids, mask, c_ids, c_mask, a in zip(
            kept["prompt_ids"],
            kept["prompt_mask"],
            kept["completion_ids"],
            kept["completion_mask"],
            kept["advantages"],
        )
    ]
    assert any(r.advantage != 0 for r in rollouts)
    cfg = config_from_dict(
        {
            "selection": {"rule": "max_variance", "n": N, "m": M},
            "prompts_per_step": PROMPTS,
            "device": "cpu",
            "loss": {"aggregation": "sequence", "beta": 0.0, "reference_forward": False},
            "optim": {"max_grad_norm": 1e9, "micro_batch_size": 64},
            "sampling": {"temperature": 1.0},
            "budget": {"max_steps": 1},
        }
    )
    update_policy(learner, rollouts, cfg)
    assert len(optimizer.grads) == len(trl_grads)
    scale = max(g.abs().max().item() for g in trl_grads)
    assert scale > 0
    for ours, theirs in zip(optimizer.grads, trl_grads):
        torch.testing.assert_close(ours, theirs, atol=1e-5 * scale, rtol=1e-3)


def test_real_steps_train_on_m_of_n_and_log_the_wasted_work(setup):
    make, _, _ = setup
    trainer = make(steps=3)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "pods/rollouts_trained" in entry]
    assert len(logs) == 3
    for entry in logs:
        assert entry["pods/rollouts_generated"] == PROMPTS * N
        assert entry["pods/rollouts_trained"] == PROMPTS * M
        assert entry["pods/rollouts_not_trained"] == PROMPTS * (N - M)
        assert 0.0 <= entry["pods/frac_kept_reward_zero_std"] <= 1.0
    assert any(not torch.equal(w, p) for w, p in zip(weights, trainer.model.parameters()))


def test_settings_the_paper_semantics_cannot_use_are_refused(setup):
    make, _, _ = setup
    with pytest.raises(PodsBenchError, match="pods_m"):
        make(pods_m=N + 1)
    with pytest.raises(PodsBenchError, match="unknown selection rule"):
        make(pods_rule="nope")
