"""Pilot-Commit: spend a few rollouts to find the prompts worth many (databricks/pilot-commit@6def20e,
recipe/pc/pc_ray_trainer.py and recipe/pc/replay_buffer.py; defaults from its paper scripts
train_scripts/pc_qwen*.sh: 3 x P pilot prompts per round, n_c = 3 n_p, pass window [0.125, 0.75],
eviction at pass rate 1, age limit 4 steps, 10 rounds).

Per step, in rounds (pc_ray_trainer.py:L427-L700):
  1. commit: take up to the rest of the batch from the buffer (all of it if it holds no more than
     needed, else at random or by highest pilot std; replay_buffer.py:L106-L183) and sample
     n_c = n - n_p more rollouts of each; pilot + commit rollouts train as one group of n, their
     advantages normalised over all of them (L652-L666). Pilots from an earlier step are used as
     they are: old log-probs come from the current policy, no importance weights (L719-L728).
  2. pilot: sample n_p rollouts of each of the round's new prompts. A prompt whose pilot pass rate
     lies in [pass_low, 1 - pass_high_margin] (both ends included, L314) enters the buffer with its
     pilot rollouts; one at or above solve_threshold is evicted: never piloted again (L330-L352).
     The others come back next epoch.
  3. another round until the batch has P groups, at most max_rounds (L669-L683).
Once the batch is full, buffered pilots more than max_off_steps steps old are dropped (flush, L700):
a pilot is committed at most max_off_steps + 1 updates after it was sampled.

The commit order defaults to the highest pilot std first, as the paper's headline run
(databricks/pilot-commit@8ca7605, train_scripts/pc_qwen2.5-1.5b_p32c96.sh:
buffer_sampling_method=max_variance); "random" is the code's default.

Differences from the code, on purpose: the buffer and the evicted set persist across epochs and
are saved in checkpoints (the code clears the buffer and drops a partial batch at each epoch end, and
saves neither); eviction takes effect at once (the code applies it at the epoch's end: within an
epoch a prompt is not drawn twice anyway); commit and pilot rollouts are two sampling calls (one
in the code); the pass rate is correctness, as the code's `acc`. Because the buffer outlives an
epoch, a buffered prompt can be piloted again: its newer pilot replaces the buffered one, in the
window or not (a prompt piloted as solved leaves the buffer as it is evicted). Once every prompt
is evicted, a step still commits what the buffer holds and stops the run only if that cannot fill
the batch, before it samples anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from pods_bench.allocation.base import (
    ALLOCATION_STRATEGIES,
    AllocationStrategy,
    RoundsConfig,
    StepShape,
    check_not_exhausted,
    require,
    short_batch,
)
from pods_bench.errors import PodsBenchError
from pods_bench.sampling import Groups, RolloutSampler


@dataclass
class PilotCommitConfig(RoundsConfig):
    """Pilot-Commit (allocation.strategy: pilot_commit); defaults from its paper scripts."""

    pilot_prompts: int | None = None  # new prompts piloted per round; None: 3 x prompts_per_step
    pilot_rollouts: int | None = None  # n_p; None: selection.n / 4. The commit samples n - n_p more
    pass_low: float = 0.125  # buffered if pass_low <= pilot pass rate <= 1 - pass_high_margin
    pass_high_margin: float = 0.25
    solve_threshold: float | None = 1.0  # pilot pass rate >= this: never piloted again; None: no eviction
    commit_order: Literal["random", "max_std"] = "max_std"  # which buffered prompts a commit takes first
    max_off_steps: int = 4  # buffered pilots older than this many steps are dropped

    def __post_init__(self):
        self._check("pilot_commit")
        require(
            self.pilot_prompts is None or self.pilot_prompts >= 1,
            "config key allocation.pilot_commit.pilot_prompts must be >= 1 (or null: 3 x prompts_per_step)",
        )
        require(
            self.pilot_rollouts is None or self.pilot_rollouts >= 1,
            "config key allocation.pilot_commit.pilot_rollouts must be >= 1 (or null: selection.n / 4)",
        )
        require(
            0 <= self.pass_low <= 1 - self.pass_high_margin <= 1,
            "config key allocation.pilot_commit: the pass window [pass_low, 1 - pass_high_margin] must lie in "
            f"[0, 1] and not be empty, got [{self.pass_low}, {1 - self.pass_high_margin}]",
        )
        require(
            self.solve_threshold is None or 0 < self.solve_threshold <= 1,
            "config key allocation.pilot_commit.solve_threshold must be in (0, 1] (or null: no eviction)",
        )
        require(self.max_off_steps >= 0, "config key allocation.pilot_commit.max_off_steps must be >= 0")


@dataclass
class Buffered:
    """A buffered prompt, as every process knows it (its pilot rollouts are on process `owner`)."""

    step: int  # when its pilot was sampled
    owner: int
    pass_rate: float
    std: float  # of the pilot's correctness: the "max_std" commit order


@ALLOCATION_STRATEGIES.register("pilot_commit", settings=PilotCommitConfig)
class PilotCommit(AllocationStrategy):
    # what collect() logs after the step record (docs/results-format.md)
    counters = (
        "num_gen_batches",
        "groups_sampled",
        "rollouts_pilot",
        "rollouts_commit",
        "prompts_buffered",
        "buffer_size",
        "prompts_evicted",
        "commit_age_mean",
    )
    example_settings = {"when_short": "train", "max_rounds": 1}

    name = "pilot_commit"

    @classmethod
    def check_config(cls, settings: PilotCommitConfig, shape: StepShape) -> None:
        n, n_p = shape.n, settings.pilot_rollouts
        n_p = n_p if n_p is not None else n // 4
        require(
            1 <= n_p < n,
            f"config key allocation.pilot_commit.pilot_rollouts must be in 1..selection.n - 1 = {n - 1} "
            f"(pilot and commit rollouts make up the n of a group), got {n_p}",
        )

    def __init__(self, settings: PilotCommitConfig, shape: StepShape, num_prompts: int):
        super().__init__(settings, shape, num_prompts)
        c, n = settings, shape.n
        self.n_pilot = c.pilot_rollouts if c.pilot_rollouts is not None else n // 4
        self.n_commit = n - self.n_pilot
        self.pilot_prompts = c.pilot_prompts or 3 * shape.prompts_per_step
        self.buffer: dict[int, Buffered] = {}  # prompt -> entry, in order of entry (the same everywhere)
        self.pilots: dict[int, Groups] = {}  # prompt -> its pilot rollouts (on its owner only)
        self.evicted: set[int] = set()

    # --- one step ---------------------------------------------------------------------------------

    def choose_commits(self, rng: np.random.Generator, need: int) -> list[int]:
        """Up to `need` buffered prompts: all if no more are buffered, else by `commit_order`."""
        prompts = list(self.buffer)
        if len(prompts) <= need:
            return prompts
        if self.settings.commit_order == "max_std":  # ties: the more recent pilot, then the prompt index
            return sorted(prompts, key=lambda p: (-self.buffer[p].std, -self.buffer[p].step, p))[:need]
        return [prompts[i] for i in sorted(rng.choice(len(prompts), size=need, replace=False))]

    def all_evicted(self) -> bool:
        return len(self.evicted) >= self.num_prompts

    def check_can_fill(self, have: int, want: int) -> None:
        """Once every prompt is evicted only the buffer can fill the batch: stop before sampling if it cannot."""
        if self.all_evicted() and have + len(self.buffer) < want:
            raise PodsBenchError(
                f"allocation.pilot_commit: all {self.num_prompts} training prompts are evicted as solved (pilot "
                f"pass rate >= solve_threshold={self.settings.solve_threshold}) and the buffer holds "
                f"{len(self.buffer)} of the {want - have} prompts the batch still needs; raise it, or null: no eviction"
            )

    def draw_pilots(self, sampler: RolloutSampler, count: int) -> tuple[list[int], int]:
        """(the next `count` prompts that are not evicted, prompts drawn): at most one pass over the data,
        none once every prompt is evicted."""
        if self.all_evicted():
            return [], 0
        return sampler.draw_where(count, lambda p: p not in self.evicted)

    def collect(self, sampler: RolloutSampler) -> tuple[Groups, dict]:
        c, want = self.settings, self.shape.prompts_per_step
        parts, have, drawn, ages = [], 0, 0, []
        stats = {
            "num_gen_batches": 0,
            "groups_sampled": 0,
            "rollouts_pilot": 0,
            "rollouts_commit": 0,
            "prompts_buffered": 0,
        }
        while True:
            self.check_can_fill(have, want)
            # 1. commit: the rest of the batch from the buffer, before this round's pilots join it
            commits = self.choose_commits(sampler.rng(stats["num_gen_batches"]), want - have)
            local, everyone = sampler.sample(commits, self.n_commit, owners=[self.buffer[p].owner for p in commits])
            parts.append(Groups.concat([self.pilots.pop(p) for p in local.prompt]).join(local))
            ages += [sampler.step - self.buffer.pop(p).step for p in commits]
            have += len(commits)
            # 2. pilot: new prompts; the informative ones wait in the buffer, the solved ones leave
            pilots, count = self.draw_pilots(sampler, self.pilot_prompts)
            drawn += count
            pilot_local, pilot_everyone = sampler.sample(pilots, self.n_pilot)
            for g in pilot_everyone:
                # a newer pilot of a buffered prompt replaces it, in the window or not
                self.buffer.pop(g.prompt, None)
                self.pilots.pop(g.prompt, None)
                if c.solve_threshold is not None and g.pass_rate >= c.solve_threshold:
                    self.evicted.add(g.prompt)  # never buffered, even where the window reaches the threshold
                elif c.pass_low <= g.pass_rate <= 1 - c.pass_high_margin:
                    self.buffer[g.prompt] = Buffered(sampler.step, g.owner, g.pass_rate, float(np.std(g.correct)))
                    if g.owner == sampler.rank:
                        self.pilots[g.prompt] = pilot_local.rows([g.row])
                    stats["prompts_buffered"] += 1
            stats["num_gen_batches"] += 1
            stats["groups_sampled"] += len(everyone) + len(pilot_everyone)
            stats["rollouts_commit"] += len(everyone) * self.n_commit
            stats["rollouts_pilot"] += len(pilot_everyone) * self.n_pilot
            # 3. another round?
            if have >= want:
                break
            why = "too few piloted prompts had a pass rate in the window"
            if not self.buffer:  # buffered prompts are committed in the next round
                check_not_exhausted(c, self.name, drawn, self.num_prompts, have, want, why)
            if not short_batch(self.name, c, have, want, stats["num_gen_batches"], why):
                break
        for p in [p for p, e in self.buffer.items() if sampler.step - e.step > c.max_off_steps]:
            del self.buffer[p]
            self.pilots.pop(p, None)
        stats.update(
            buffer_size=len(self.buffer),
            prompts_evicted=len(self.evicted),
            commit_age_mean=float(np.mean(ages)) if ages else None,
        )
        return Groups.concat(parts), stats

    # --- checkpoints --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "buffer": [(p, e.step, e.owner, e.pass_rate, e.std) for p, e in self.buffer.items()],
            "pilots": {p: g.to_dict() for p, g in self.pilots.items()},
            "evicted": sorted(self.evicted),
        }

    def load_state_dict(self, state: dict) -> None:
        self.buffer = {p: Buffered(step, owner, rate, std) for p, step, owner, rate, std in state["buffer"]}
        self.pilots = {p: Groups.from_dict(g) for p, g in state["pilots"].items()}
        self.evicted = set(state["evicted"])
