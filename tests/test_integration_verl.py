"""PODS as a verl-style trajectory filter (pods_bench/integrations/verl.py): uids and sequence rewards
in, kept indices and metrics out, as verl's DAPO `filter_groups` block consumes them."""

from __future__ import annotations

import pytest

from pods_bench.errors import PodsBenchError
from pods_bench.integrations.verl import select_trajectories


def test_it_keeps_the_max_variance_m_of_each_uid_in_batch_order():
    # two prompts, interleaved in the batch as a balanced batch may leave them; n = 4, m = 2
    uids = ["a", "b", "a", "b", "a", "b", "a", "b"]
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.0]
    kept, metrics = select_trajectories(uids, rewards, m=2)
    # a: rewards 1, 1, 0, 0.5 at rows 0, 2, 4, 6 -> max variance keeps a highest and the lowest: rows 2
    # and 4 (of the two 1s, the one a stable ascending sort puts last: pods_bench.selection's tie rule)
    # b: all 0 -> rows 1 and 3 (ties by index)
    assert kept == [1, 2, 3, 4]
    assert metrics == {
        "pods/rollouts_generated": 8.0,
        "pods/rollouts_trained": 4.0,
        "pods/rollouts_not_trained": 4.0,
        "pods/frac_reward_zero_std": 0.5,
        "pods/frac_kept_reward_zero_std": 0.5,
    }


def test_other_rules_and_bad_batches():
    uids = ["a"] * 4
    kept, _ = select_trajectories(uids, [0.1, 0.9, 0.5, 0.7], m=2, rule="max_reward")
    assert kept == [1, 3]
    with pytest.raises(PodsBenchError, match="same number of trajectories"):
        select_trajectories(["a", "a", "b"], [0, 1, 0], m=1)
    with pytest.raises(PodsBenchError, match="3 uids but 2 rewards"):
        select_trajectories(["a", "a", "b"], [0, 1], m=1)
    with pytest.raises(PodsBenchError, match="m"):
        select_trajectories(uids, [0, 1, 0, 1], m=5)
