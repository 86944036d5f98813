"""PODS as a verl-style trajectory filter: a batch of groups in, the kept trajectory indices and
metrics out. No verl import: the function takes what verl's batch holds (a `uid` per trajectory and a
sequence reward per trajectory) and returns plain indices.

verl's DAPO recipe filters groups at this point of its loop (volcengine/verl at 004c8880,
recipe/dapo/dapo_ray_trainer.py, the `filter_groups` block of `RayDAPOTrainer.fit`: per-uid reward
std, `kept_traj_idxs`, then `new_batch = new_batch[kept_traj_idxs]`). PODS goes in the same place and
keeps m of each uid's n trajectories instead of whole groups:

    from pods_bench.integrations.verl import select_trajectories
    rewards = new_batch.batch["token_level_scores"].sum(dim=-1)  # the sequence reward, as filter_groups' "seq_reward"
    kept, pods_metrics = select_trajectories(new_batch.non_tensor_batch["uid"], rewards, m=config.pods.m,
                                             rule=config.pods.rule)
    new_batch = new_batch[kept]
    metrics.update(pods_metrics)

with a config block such as

    pods:
      m: 4               # trajectories trained per prompt (actor_rollout_ref.rollout.n = 16 generated)
      rule: max_variance # any rule of pods_bench.selection.SELECTION_RULES

verl's GRPO advantage (`compute_grpo_outcome_advantage`) groups by uid over the rows it is given, so
after the filter it normalises over the kept m: the paper's semantics. Where the DAPO branch aligns
the batch to `train_batch_size x rollout.n` trajectories, use `x m` instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pods_bench.errors import PodsBenchError
from pods_bench.selection import select


def select_trajectories(
    uids: Sequence, rewards, m: int, rule: str = "max_variance", generator: torch.Generator | None = None
) -> tuple[list[int], dict[str, float]]:
    """(indices of the kept trajectories in batch order, metrics): m of every uid's trajectories,
    chosen by `rule` on their rewards. Every uid must have the same number of trajectories n >= m."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if len(uids) != len(rewards):
        raise PodsBenchError(f"select_trajectories: {len(uids)} uids but {len(rewards)} rewards")
    rows_of: dict = {}
    for row, uid in enumerate(uids):
        rows_of.setdefault(uid, []).append(row)
    sizes = {len(rows) for rows in rows_of.values()}
    if len(sizes) != 1:
        raise PodsBenchError(
            f"select_trajectories: every uid needs the same number of trajectories, got {sorted(sizes)}"
        )
    rows = torch.tensor(list(rows_of.values()))  # (prompts, n): batch indices, in each uid's order
    grouped = rewards[rows]
    idx = select(rule, grouped, m, generator)  # raises on m outside 1..n
    kept = sorted(rows.gather(1, idx).flatten().tolist())
    kept_rewards = grouped.gather(1, idx)
    generated = len(rewards)
    metrics = {
        "pods/rollouts_generated": float(generated),
        "pods/rollouts_trained": float(len(kept)),
        "pods/rollouts_not_trained": float(generated - len(kept)),
        # TRL's name: the share of prompts whose rewards are all equal (no GRPO gradient), over n and over the kept m
        "pods/frac_reward_zero_std": (grouped.amax(1) == grouped.amin(1)).double().mean().item(),
        "pods/frac_kept_reward_zero_std": (kept_rewards.amax(1) == kept_rewards.amin(1)).double().mean().item(),
    }
    return kept, metrics
