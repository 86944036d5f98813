"""The wall time of one training job, beside the time limit the workflow asks the scheduler for.

    job = steps x step time                        (the training clock: the run stops after the step
                                                    that passes budget.max_train_time_s, or at max_steps)
        + evaluations x evaluation time            (inline: one per checkpoint, clock paused)
        + checkpoints x checkpoint time            (clock paused)

Checkpoints are counted as the trainer takes them (train.py `Progress`): at step 0, each time the
clock passes a multiple of budget.checkpoint_every_s (one even if a step passes several), every
budget.checkpoint_every_steps steps, and at the end; with a step as long as the plan predicts.
An evaluation generates each benchmark's problems x eval.repeats, split between the processes
(pods_bench/evaluate.py `Share`), every completion at eval.max_new_tokens, at the step-time model's
generation and grading coefficients (step_time.py `predict_eval`). A checkpoint writes the whole
weights in their dtype and AdamW's two float32 moments (gathered on rank 0 under FSDP) at
`checkpoint_gbs` GB/s (a setup's key in config/hardware.yaml, default CHECKPOINT_GBS: an assumption
that covers gathering, serialising and writing). Not counted: start-up (model loading, the engines'
warm-up) and the tail of the job (the run's last records): what the limit's margin is for.

The limit is the training job's runtime (experiment.py `job_resources`, as the workflow asks for it): budget / 60 x
runtime_factor + runtime_overhead_min minutes, or the experiment's resources.train.runtime_min.
"""

from __future__ import annotations

from dataclasses import dataclass

from pods_bench.errors import PodsBenchError
from pods_bench.experiment import job_resources
from pods_bench.planning.memory import DTYPE_BYTES, trainable_params
from pods_bench.planning.step_time import StepTimeModel, predict_eval
from pods_bench.tasks import load_problems

# Published sizes of the hub benchmarks' splits (pods_bench/tasks/hub.py), so that planning reads no data.
SPLIT_SIZES = {
    ("gsm8k", "train"): 7473,
    ("gsm8k", "test"): 1319,
    ("math", "train"): 7500,
    ("math", "test"): 5000,
    ("math500", "test"): 500,
    ("amc23", "test"): 40,
}
CHECKPOINT_GBS = 1.0  # GB/s from the trainer's state to a complete checkpoint folder (an assumption)


def benchmark_sizes(cfg) -> dict[str, int]:
    """Problems evaluated per benchmark: the first eval.n_problems of the split (all without it).
    An upper bound: eval.max_prompt_tokens may drop a few. Splits of other tasks (`arith`, plugins)
    are loaded unless eval.n_problems bounds them already."""
    sizes = {}
    for name in cfg.eval.benchmarks:
        size = SPLIT_SIZES.get((name, cfg.eval.split))
        if size is None and cfg.eval.n_problems is None:
            size = len(load_problems(name, cfg.eval.split, data_dir=cfg.data_dir))
        sizes[name] = min(s for s in (size, cfg.eval.n_problems) if s is not None)
    return sizes


def checkpoint_bytes(cfg, dims) -> int:
    """What a checkpoint writes: the model (the whole weights, or with LoRA the float32 adapter) and
    AdamW's two float32 moments per trainable parameter."""
    trainable = trainable_params(cfg, dims)
    model = trainable * 4 if cfg.lora.enabled else dims.params * DTYPE_BYTES[cfg.model.dtype]
    return model + 2 * 4 * trainable


@dataclass(frozen=True)
class Schedule:
    steps: int
    train_s: float  # the training clock at the end
    checkpoints: int


def schedule(cfg, step_s: float) -> Schedule:
    """Steps and checkpoints of a run whose every step takes `step_s`, as the trainer counts them."""
    budget = cfg.budget
    if budget.max_steps is None and (budget.max_train_time_s is None or step_s <= 0):
        raise PodsBenchError("the run's length cannot be predicted: set budget.max_steps or a step time > 0")
    step, clock, checkpoint_step, checkpoint_clock, checkpoints = 0, 0.0, 0, 0.0, 1  # step 0's
    while not (
        (budget.max_steps is not None and step >= budget.max_steps)
        or (budget.max_train_time_s is not None and clock >= budget.max_train_time_s)
    ):
        clock += step_s
        step += 1
        every_steps = budget.checkpoint_every_steps
        if clock // budget.checkpoint_every_s > checkpoint_clock // budget.checkpoint_every_s or bool(
            every_steps and step % every_steps == 0
        ):
            checkpoints, checkpoint_step, checkpoint_clock = checkpoints + 1, step, clock
    if checkpoint_step != step:
        checkpoints += 1  # the end point
    return Schedule(step, clock, checkpoints)


def job_limit_min(cfg, hardware: dict, resources: dict) -> float | None:
    """The training job's runtime limit in minutes, as the workflow asks for it (None: it needs a
    resources.train.runtime_min the config does not give)."""
    try:
        return job_resources("train", hardware, resources, cfg)["runtime"]
    except PodsBenchError:
        return None


def job_time(
    cfg, dims, hardware: dict, model: StepTimeModel, step_s: float, resources: dict | None = None
) -> dict[str, float | int | bool | None]:
    """The plan's job columns: steps, training, evaluation and checkpoint time, the job's wall time in
    minutes beside its limit, and whether it fits (None: no limit known)."""
    processes = hardware["processes"]
    sizes = benchmark_sizes(cfg)
    run = schedule(cfg, step_s)
    evaluations = run.checkpoints if cfg.eval.inline else 0
    eval_s = predict_eval(model, cfg, processes, sizes)
    gbs = hardware.get("checkpoint_gbs", CHECKPOINT_GBS)
    checkpoint_s = checkpoint_bytes(cfg, dims) / (gbs * 1e9)
    job_s = run.train_s + evaluations * eval_s + run.checkpoints * checkpoint_s
    limit = job_limit_min(cfg, hardware, resources or {})
    return {
        "eval_problems": sum(sizes.values()) * cfg.eval.repeats,
        "eval_s": round(eval_s, 2),
        "eval_one_process_s": round(predict_eval(model, cfg, 1, sizes), 2),  # rank 0 alone, as before sharing
        "steps": run.steps,
        "train_s": round(run.train_s, 1),
        "evaluations": evaluations,
        "checkpoints": run.checkpoints,
        "checkpoint_s": round(checkpoint_s, 2),
        "job_min": round(job_s / 60, 1),
        "limit_min": limit,
        "job_fits": None if limit is None else bool(job_s / 60 <= limit),
    }
