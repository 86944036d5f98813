"""Rollout allocation: which prompts get how many rollouts in a step (step 1-3 of pods_bench.train).

A strategy's `collect(sampler)` (pods_bench/sampling.py: the seeded prompt stream, sampling and
grading) returns the groups the step trains on, each of graded rollouts of one prompt: selection.n
of them, or (vigor, hora) as many as the strategy gave the prompt; the selection rule then keeps m
of each group, or all of a group no larger than m (pods_bench/selection.py), so every strategy
composes with every rule (Pilot-Commit + max_variance is PODS inside Pilot-Commit).

  uniform           the next P prompts, n rollouts each: GRPO and PODS as the paper runs them
  dynamic_sampling  DAPO: rounds of new prompts; groups whose n rewards are all equal are dropped
                    until P are left (verl recipe/dapo)
  greso             GRESO: dynamic sampling, and before rollout each prompt is skipped with a
                    probability that grows with its streak of all-correct / all-wrong groups
  pilot_commit      Pilot-Commit: pilot new prompts with n_p rollouts; prompts whose pilot pass rate
                    is informative wait in a buffer; the batch commits n - n_p more rollouts to
                    buffered prompts and trains on pilot + commit as one group
  vigor             VIGOR: rounds within the step; the prompts whose rewards vary most so far get
                    growing numbers of rollouts; groups of different sizes
  hora              HORA: a probe of G0 rollouts per prompt, the rest of the budget by marginal hit
                    utility under a Beta posterior; groups of different sizes
  reward_variance_filter  RAGEN-2: the next P prompts, n rollouts each; train only the groups whose
                    reward std is highest (top-p of the summed std, or top-k), no refill

Each strategy registers itself in its own module with its settings dataclass, which types the
config section `allocation.<strategy>` (pods_bench/plugins.py); `make_allocator` hands the strategy
those settings and the step's shape (`StepShape`), nothing else of the config. Its per-prompt state
is saved in every checkpoint. docs/allocation.md compares them.
"""

from __future__ import annotations

from pods_bench.allocation.base import ALLOCATION_STRATEGIES, AllocationStrategy, StepShape

# importing a strategy's module registers it; this order is the order config errors list them in
# isort: off
from pods_bench.allocation import uniform  # noqa: E402, F401
from pods_bench.allocation import dynamic_sampling, greso, pilot_commit  # noqa: E402, F401
from pods_bench.allocation import vigor, hora  # noqa: E402, F401
from pods_bench.allocation import reward_variance_filter  # noqa: E402, F401
# isort: on

__all__ = ["ALLOCATION_STRATEGIES", "AllocationStrategy", "StepShape", "make_allocator", "step_shape"]


def step_shape(cfg) -> StepShape:
    """The step's shape of a training config (prompts_per_step, selection.n, selection.groups_per_prompt)."""
    return StepShape(cfg.prompts_per_step, cfg.selection.n, cfg.selection.groups_per_prompt)


def make_allocator(cfg, num_prompts: int) -> AllocationStrategy:
    """The strategy `cfg.allocation.strategy` names, for a run with `num_prompts` training prompts:
    given its own settings (allocation.<strategy>, typed) and the step's shape."""
    allocation = cfg.allocation
    settings = ALLOCATION_STRATEGIES.typed_settings(allocation)
    return ALLOCATION_STRATEGIES[allocation.strategy](settings, step_shape(cfg), num_prompts)
