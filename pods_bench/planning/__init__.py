"""Planning a run before spending GPU hours on it (`pods-bench plan`, `pods-bench profile`).

- architecture.py: a config's model dimensions and parameter counts, without loading weights
- memory.py: memory per device by component, and whether it fits the hardware setup
- step_time.py: the step-time model (per-phase linear costs), fitted from train logs or derived
  from a hardware profile
- plan.py: both for every arm of an experiment config, the workflow's fit check, the report
- profile.py: a few interleaved steps of every arm on this machine, fitted into a step-time model
- step_time_fit.py: a hardware profile's step-time model fixed by the measured steps of two arms
  (the published L40S logs' GRPO 16/16 and PODS 64/16)
docs/cost-model.md explains the model and how well it predicts.
"""
