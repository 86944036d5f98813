"""pods-bench's selection rules inside other trainers (each module imports its framework lazily, so
pods-bench never depends on it): `trl` for TRL's GRPOTrainer."""
