"""pods-bench: a reference replication package for PODS (rollout down-sampling in GRPO).

One code path for selection rules, verifier rewards, benchmark tasks, rollout engines, the
GRPO/PODS trainer, evaluation and the time-to-peak analysis.
"""

__version__ = "0.1.0"
