"""The step-time model: each phase of a training step as a linear function of the work it does.

    gen     = g0 + g_step x decode_steps + g_seq x decode_sequence_steps
              (per decoding step a fixed cost (weights read, kernel launches, Python) plus a cost per
               row in flight; HF generate keeps finished rows in its batch until the call ends)
    reward  = r0 + r_rollout x rollouts
    select  = s0 + s_rollout x rollouts
    update  = u0 + u_micro x micro_batches + u_token x update_tokens   (padded rows x width)
    sync    = y0

The features are what every train_log.jsonl line records (docs/results-format.md), so the
coefficients are fitted from real steps (`fit`, non-negative least squares per phase: scipy's nnls,
a cost cannot be negative) or derived from a hardware profile's datasheet numbers (`from_hardware`).
`predict` turns a config into the features of one step (uniform allocation) and sums the phases.
`predict_eval` prices one checkpoint's evaluation with the same generation and grading coefficients.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from pods_bench.planning.memory import kv_bytes_per_token, sequences_per_process, trained_per_process
from pods_bench.run_dir import phase_field

PHASE_FEATURES = {
    "gen": ("1", "decode_steps", "decode_sequence_steps"),
    "reward": ("1", "rollouts_generated"),
    "select": ("1", "rollouts_generated"),
    "update": ("1", "micro_batches", "update_tokens"),
    "sync": ("1",),
}


@dataclass
class StepLengths:
    """Token counts a prediction needs beyond the config: the decoding steps of one generate call
    (its longest completion), the mean completion, and the padded width of an update row."""

    decode_width: float
    completion_mean: float
    update_width: float

    @classmethod
    def from_config(cls, cfg) -> StepLengths:
        """Upper bounds from the config's limits (every call runs to max_new_tokens, every row as
        wide as the longest prompt allowed), the mean completion at half the limit."""
        new = cfg.sampling.max_new_tokens
        return cls(new, new / 2, cfg.task.max_prompt_tokens + new)

    @classmethod
    def from_records(cls, records: list[dict]) -> StepLengths:
        """Means over train_log.jsonl lines (one process; uniform or not)."""
        mean = lambda values: float(np.mean(values))
        return cls(
            # rows x steps / rows: the decoding steps of a row's call, averaged over rows
            mean([r["decode_sequence_steps"] / max(1, r["rollouts_generated"]) for r in records]),
            mean([r["completion_len_mean"] for r in records]),
            mean([r["update_tokens"] / max(1, r["prompts_kept"] * r["m"]) for r in records]),
        )

    def capped(self, cfg) -> StepLengths:
        """These lengths within cfg's limits: lengths measured under a higher max_new_tokens cannot
        all carry over to a lower one (no completion is longer than the limit)."""
        new = cfg.sampling.max_new_tokens
        cut = max(0.0, self.decode_width - new)  # a padded update row is prompt + longest completion
        return StepLengths(self.decode_width - cut, min(self.completion_mean, new), self.update_width - cut)


@dataclass
class StepTimeModel:
    """Seconds per unit of each feature, by phase (keys of PHASE_FEATURES); `source` says where they came from."""

    coefficients: dict[str, dict[str, float]]
    source: str = ""
    lengths: StepLengths | None = None  # the lengths measured where the model was fitted
    notes: list[str] = field(default_factory=list)

    def phase_seconds(self, features: dict[str, float]) -> dict[str, float]:
        return {
            phase: sum(self.coefficients[phase].get(f, 0.0) * (1.0 if f == "1" else features[f]) for f in names)
            for phase, names in PHASE_FEATURES.items()
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> StepTimeModel:
        lengths = StepLengths(**d["lengths"]) if d.get("lengths") else None
        return cls(d["coefficients"], d.get("source", ""), lengths, list(d.get("notes", [])))


def fit(records: list[dict], source: str = "") -> StepTimeModel:
    """Coefficients from train_log.jsonl lines of one-process runs (several arms: the features must
    vary), non-negative least squares per phase on the phase times."""
    from scipy.optimize import nnls

    coefficients = {}
    for phase, names in PHASE_FEATURES.items():
        x = np.array([[1.0 if f == "1" else float(r[f]) for f in names] for r in records])
        y = np.array([float(r[phase_field(phase)]) for r in records])
        scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # features differ by orders of magnitude
        solution, _ = nnls(x / scale, y)
        coefficients[phase] = dict(zip(names, (solution / scale).tolist()))
    return StepTimeModel(coefficients, source, StepLengths.from_records(records))


def step_features(cfg, processes: int, lengths: StepLengths) -> dict[str, float]:
    """The features of one step of `cfg` on one process (uniform allocation: P/K prompts x G groups
    x n rollouts sampled, x m trained)."""
    sequences, kept = sequences_per_process(cfg, processes), trained_per_process(cfg, processes)
    calls = math.ceil(sequences / cfg.engine.max_batch) if cfg.engine.name == "hf" else 1
    per_row = lengths.decode_width if cfg.engine.name == "hf" else lengths.completion_mean
    return {
        "decode_steps": calls * lengths.decode_width,
        "decode_sequence_steps": sequences * per_row,
        "rollouts_generated": sequences,
        "micro_batches": math.ceil(kept / cfg.optim.micro_batch_size),
        "update_tokens": kept * lengths.update_width,
    }


def predict(model: StepTimeModel, cfg, processes: int = 1, lengths: StepLengths | None = None) -> dict[str, float]:
    """Seconds per phase of one step of `cfg`, and their sum under "step". Lengths: those given, else
    the ones measured where the model was fitted (within cfg's limits), else the config's bounds."""
    lengths = lengths or (model.lengths.capped(cfg) if model.lengths else StepLengths.from_config(cfg))
    phases = model.phase_seconds(step_features(cfg, processes, lengths))
    return {**phases, "step": sum(phases.values())}


def eval_features(cfg, processes: int, n_problems: int) -> dict[str, float]:
    """The generation and grading features of one evaluation pass over a benchmark of `n_problems`,
    on the process with the largest slice (inline evaluation is shared by the processes,
    pods_bench/evaluate.py `Share`): one generate call of its rows, every completion at
    eval.max_new_tokens (HF generate runs a call until its longest row stops)."""
    rows = math.ceil(n_problems / processes)
    new = cfg.eval.max_new_tokens
    calls = math.ceil(rows / cfg.engine.max_batch) if cfg.engine.name == "hf" else 1
    return {"decode_steps": calls * new, "decode_sequence_steps": rows * new, "rollouts_generated": rows}


def predict_eval(model: StepTimeModel, cfg, processes: int, sizes: dict[str, int]) -> float:
    """Seconds of one checkpoint's evaluation shared by `processes`: `sizes` (benchmark -> problems),
    eval.repeats passes of each, priced as the generation and grading phases of a step are."""
    seconds = 0.0
    for n_problems in sizes.values():
        phases = model.phase_seconds(
            {**eval_features(cfg, processes, n_problems), "micro_batches": 0, "update_tokens": 0}
        )
        seconds += cfg.eval.repeats * (phases["gen"] + phases["reward"])
    return seconds


def from_hardware(cfg, dims, hardware: dict, lengths: StepLengths | None = None) -> StepTimeModel:
    """First-principles coefficients from a hardware profile (config/hardware.yaml `accelerator`):

    - a decoding step reads every weight once (bf16) at decode_efficiency x the memory bandwidth;
      each row in flight costs 2 x params FLOPs at train_efficiency x the bf16 peak, plus reading
      its KV cache (context: the prompt and half the completion);
    - an update token costs 6 x params FLOPs (forward 2, backward 4) in full fine-tuning, 4 with LoRA
      (no weight gradients of the frozen base), + 2 with gradient checkpointing (the forward again);
    - grading: math-verify parses about 300 answers a second per core (../shared ENVIRONMENT.md
      measured 200-400), spread over reward.workers processes;
    - vLLM's weight sync copies the weights once at half the bandwidth; HF generate shares them."""
    a = hardware["accelerator"]
    lengths = lengths or StepLengths.from_config(cfg)
    flops = a["bf16_tflops"] * 1e12 * a["train_efficiency"]
    bandwidth = a["bandwidth_gbs"] * 1e9
    context = lengths.update_width - lengths.decode_width + lengths.completion_mean / 2
    per_row = 2 * dims.params / flops + kv_bytes_per_token(dims, 2) * context / (bandwidth * a["decode_efficiency"])
    per_token = (4 if cfg.lora.enabled else 6) + (2 if cfg.model.gradient_checkpointing else 0)
    coefficients = {
        "gen": {
            "decode_steps": 2 * dims.params / (bandwidth * a["decode_efficiency"]),
            "decode_sequence_steps": per_row,
        },
        "reward": {"rollouts_generated": 1 / 300 / max(1, cfg.reward.workers)},
        "select": {},
        "update": {"update_tokens": per_token * dims.params / flops},
        "sync": {"1": 2 * dims.params / (bandwidth * 0.5) if cfg.engine.name == "vllm" else 0.0},
    }
    return StepTimeModel(coefficients, f"hardware profile ({hardware.get('description', '')})", lengths)
