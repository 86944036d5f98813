"""Step time of GRPO vs GRPO-PODS at equal rollouts on the smoke model, measured side by side.

Both arms sample n = 16 completions for each of 8 prompts per step; GRPO trains on all 16, PODS on
the 4 of largest reward variance. Reported (and checked against the smoke benchmark's goals):
  - PODS step time / GRPO step time (goal <= 0.6: the update is the cost PODS cuts)
  - the share of a step spent in selection + advantages (goal < 1 %: selection must be free)
Run with `make bench`; skipped in the plain test run because it measures, it does not test.
"""

from __future__ import annotations

import statistics

import pytest

from pods_bench.config import config_from_dict
from pods_bench.train import train
from tests.tiny_runs import read_lines

pytestmark = pytest.mark.benchmark

ARMS = {"grpo": {"rule": "all", "n": 16, "m": 16}, "pods": {"rule": "max_variance", "n": 16, "m": 4}}
STEPS = 8  # the first step is a warm-up and is left out


def _step_times(run_dir) -> list[dict]:
    return read_lines(run_dir / "train_log.jsonl")[1:]


def test_pods_step_is_cheaper_than_grpo_at_equal_rollouts(request, smoke_model_dir, tmp_path):
    options = request.config.getoption
    if options("benchmark_disable", False) and not options("benchmark_enable", False):
        pytest.skip("step-time ratios are measured only with --benchmark-enable")
    logs = {}
    for arm, selection in ARMS.items():
        cfg = config_from_dict(
            {
                "experiment": "bench",
                "arm": arm,
                "device": "cpu",
                "output_dir": str(tmp_path / arm),
                "prompts_per_step": 8,
                "model": {"name": str(smoke_model_dir)},
                "task": {"name": "arith", "system_prompt": "", "limit": 512},
                "sampling": {"temperature": 1.0, "max_new_tokens": 32},
                "selection": selection,
                "optim": {"lr": 1e-4, "micro_batch_size": 128},
                "reward": {"workers": 0},
                "budget": {"max_steps": STEPS, "checkpoint_every_s": 3600},
                "eval": {"benchmarks": [], "inline": False},
            }
        )
        train(cfg, progress=False)
        logs[arm] = _step_times(tmp_path / arm)

    def median(arm, *fields):
        return statistics.median(sum(r[f] for f in fields) for r in logs[arm])

    phases = ("time_gen_s", "time_reward_s", "time_select_s", "time_update_s", "time_sync_s")
    ratio = median("pods", *phases) / median("grpo", *phases)
    select_share = median("pods", "time_select_s") / median("pods", *phases)
    print(
        f"\nstep time (median of {STEPS - 1} steps): GRPO 16/16 {median('grpo', *phases):.3f} s, "
        f"PODS 16/4 {median('pods', *phases):.3f} s, ratio {ratio:.2f} (goal <= 0.6); "
        f"selection + advantages {100 * select_share:.3f} % of a PODS step (goal < 1 %)"
    )
    for arm in ARMS:
        print(f"  {arm}: " + ", ".join(f"{p[5:-2]} {median(arm, p):.3f} s" for p in phases))
    assert ratio <= 0.6
    assert select_share < 0.01
