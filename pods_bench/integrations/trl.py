"""GRPO-PODS inside TRL's GRPOTrainer (trl 1.16: the `bench` extra, `pip install "pods-bench[bench]"`).

    from pods_bench.integrations.trl import PODSGRPOTrainer
    trainer = PODSGRPOTrainer(pods_m=4, model=..., reward_funcs=..., args=GRPOConfig(num_generations=16, ...),
                              train_dataset=...)  # then trainer.train(), as with GRPOTrainer

TRL samples `num_generations` = n completions per prompt and scores them as it always does. Before
the update this trainer keeps m = `pods_m` of each prompt's n, chosen by a pods-bench selection rule
(`pods_rule`, default "max_variance": PODS) on the rewards TRL computed, recomputes the advantages
over the kept m (the paper's semantics: A_i = (r_i - mean_m) / (std_m + 1e-4), selection.group_advantages,
which is TRL's own group normalisation applied to the m), and hands TRL's loss only the kept rows.
The rest of TRL's step (log-probs, loss_type, clipping, KL, optimizer) is unchanged.

Where it hooks in (trl 1.16, trl/trainer/grpo_trainer.py): `_calculate_rewards` is wrapped to keep
its result (every completion's rewards, gathered over processes, one column per reward function),
and `_generate_and_score_completions`' output, a dict of per-row tensors, is cut to the kept rows.
Both are private methods; a TRL release may change them, so the tests pin trl 1.16. TRL's public
extension points (reward functions, callbacks, `rollout_func`) cannot drop rows from a batch.

Limits, checked when the trainer is built: with `scale_rewards="batch"` or several reward functions
normalised separately (`multi_objective_aggregation="normalize_then_sum"`) the paper's per-group
advantage over the m is not defined, so both are refused; each process's share of a generation batch
must hold whole groups (`per_device_train_batch_size x steps_per_generation` a multiple of n), so
that every process keeps the same number of rows, and the kept rows must split evenly into
`steps_per_generation` batches.

Logged beside TRL's metrics, named as TRL names its own: `pods/rollouts_generated`,
`pods/rollouts_trained`, `pods/rollouts_not_trained` (per step, this process), and
`pods/frac_kept_reward_zero_std` (the share of prompts whose kept rewards are all equal: no gradient;
TRL's `frac_reward_zero_std` is over all n).
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer

from pods_bench.errors import PodsBenchError
from pods_bench.selection import SELECTION_RULES, group_advantages, select

ADVANTAGE_EPS = 1e-4  # TRL's and the authors' epsilon in (r - mean) / (std + eps)


class PODSGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that trains on m of every n completions (module docstring)."""

    def __init__(self, *args, pods_m: int, pods_rule: str = "max_variance", **kwargs):
        super().__init__(*args, **kwargs)
        n, grpo = self.num_generations, self.args
        if pods_rule not in SELECTION_RULES:
            raise PodsBenchError(
                f"pods_rule: unknown selection rule {pods_rule!r}; choose from {', '.join(SELECTION_RULES)}"
            )
        if isinstance(pods_m, bool) or not isinstance(pods_m, int) or not 1 <= pods_m <= n:
            raise PodsBenchError(
                f"pods_m (completions trained per prompt) must be an integer in 1..{n}, got {pods_m!r}"
            )
        if self.scale_rewards == "batch" or self.multi_objective_aggregation != "sum_then_normalize":
            raise PodsBenchError(
                "PODSGRPOTrainer normalises advantages per prompt over the kept completions: use scale_rewards "
                "'group' or 'none' and multi_objective_aggregation 'sum_then_normalize'"
            )
        local = grpo.per_device_train_batch_size * grpo.steps_per_generation
        if local % n:
            raise PodsBenchError(
                f"per_device_train_batch_size x steps_per_generation ({local}) must be a multiple of num_generations "
                f"({n}): each process must hold whole groups to keep m of each"
            )
        if (local // n * pods_m) % grpo.steps_per_generation:
            raise PodsBenchError(
                f"the {local // n * pods_m} kept rows of a process do not split into steps_per_generation "
                f"({grpo.steps_per_generation}) equal batches"
            )
        self.pods_m, self.pods_rule = pods_m, pods_rule
        self._pods_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._pods_rewards = rewards_per_func  # every process's rows, gathered: (rows, reward functions)
        return rewards_per_func

    def kept_rows(self, rewards: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices of the kept rows into the gathered batch, their advantages): m of each group of n
        consecutive rows (TRL's layout), chosen by the rule on the rewards."""
        n, m = self.num_generations, self.pods_m
        grouped = rewards.view(-1, n)
        idx = select(self.pods_rule, grouped, m)  # (groups, m) into each group
        kept_rewards = grouped.gather(1, idx)
        advantages = group_advantages(kept_rewards, scale_by_std=self.scale_rewards != "none", eps=ADVANTAGE_EPS)
        rows = (torch.arange(grouped.shape[0], device=idx.device).unsqueeze(1) * n + idx).flatten()
        return rows, advantages.flatten()

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation scores every completion
            return output
        # TRL's total reward: the weighted sum over reward functions (NaN: no function scored the row)
        weights = self.reward_weights.to(self._pods_rewards.device).unsqueeze(0)
        rewards = torch.nan_to_num((self._pods_rewards * weights).nansum(dim=1), nan=0.0)
        rows, advantages = self.kept_rows(rewards)
        local = output["completion_ids"].shape[0]
        start = self.accelerator.process_index * local
        mine = (rows >= start) & (rows < start + local)
        local_rows = (rows[mine] - start).to(output["completion_ids"].device)
        kept = {}
        for key, value in output.items():
            if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == local:
                kept[key] = value[local_rows]
            else:
                kept[key] = value
        kept["advantages"] = advantages[mine].to(output["advantages"].device, output["advantages"].dtype)
        if "num_items_in_batch" in output:  # the loss's token count (loss_type "dapo"), over the kept rows
            kept["num_items_in_batch"] = self.accelerator.gather(kept["completion_mask"].sum()).sum()
        mode = "train"
        kept_groups = advantages.view(-1, self.pods_m)
        self._metrics[mode]["pods/rollouts_generated"].append(float(local))
        self._metrics[mode]["pods/rollouts_trained"].append(float(len(local_rows)))
        self._metrics[mode]["pods/rollouts_not_trained"].append(float(local - len(local_rows)))
        self._metrics[mode]["pods/frac_kept_reward_zero_std"].append((kept_groups == 0).all(1).float().mean().item())
        return kept
