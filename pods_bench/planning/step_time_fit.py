"""The step-time model calibrated on measured step times of two arms (own runs or the published logs).

The hardware profile gives the model (pods_bench/planning/step_time.py `from_hardware`: datasheet
FLOPs and bandwidth at assumed efficiencies). Two arms that differ only in n fix its two generation
terms, the cost of a decoding step (reading the weights) and of a row in flight, by solving

    t_a - rest_a = s_step x step_a + s_row x row_a,   t_b - rest_b = s_step x step_b + s_row x row_b

where step and row are the profile's seconds for those terms and rest its seconds for everything
else (update, grading, sync), which the two arms share when they train the same m. So predictions
at other n rest on measurement, and predictions at other m on the profile's update model alone.

The published L40S logs hold GRPO 16/16 and PODS 64/16 (../shared); the calibrated model states the
step times of n in {32, 128, 256} at m = 16 and of m in {2, 4, 8} at n = 64 (docs/cost-model.md),
to be checked against the authors' published runs of those settings.
"""

from __future__ import annotations

import numpy as np

from pods_bench.analysis.paper_logs import load_paper_logs
from pods_bench.errors import PodsBenchError
from pods_bench.experiment import hardware_setup, resolve_arms
from pods_bench.planning.architecture import model_dims
from pods_bench.planning.step_time import StepLengths, StepTimeModel, from_hardware, predict, step_features


def fit_two_arms(cfg_a, cfg_b, seconds_a: float, seconds_b: float, hardware: dict, lengths: StepLengths, source: str):
    """The hardware profile's model for the setting of cfg_a / cfg_b, its two generation terms scaled
    so that it reproduces their measured step times."""
    shape = from_hardware(cfg_a, model_dims(cfg_a.model), hardware, lengths)
    gen = shape.coefficients["gen"]
    terms, rest = [], []
    for cfg, seconds in ((cfg_a, seconds_a), (cfg_b, seconds_b)):
        f = step_features(cfg, hardware["processes"], lengths)
        terms.append(
            [gen["decode_steps"] * f["decode_steps"], gen["decode_sequence_steps"] * f["decode_sequence_steps"]]
        )
        predicted = predict(shape, cfg, hardware["processes"], lengths)
        rest.append(seconds - (predicted["step"] - predicted["gen"]))
    a = np.array(terms)
    if abs(np.linalg.det(a)) < 1e-9 * np.abs(a).max() ** 2:
        raise PodsBenchError("calibration needs two arms that differ in n (rollouts per prompt)")
    s_step, s_row = np.linalg.solve(a, np.array(rest))
    if s_step <= 0 or s_row <= 0:
        raise PodsBenchError(
            f"the measured step times ({seconds_a:.3g} s, {seconds_b:.3g} s) do not fit the hardware profile's "
            f"model (generation scales {s_step:.3g}, {s_row:.3g}: its update or grading is too slow for them)"
        )
    coefficients = {phase: dict(terms) for phase, terms in shape.coefficients.items()}
    coefficients["gen"] = {**gen, "decode_steps": gen["decode_steps"] * s_step}
    coefficients["gen"]["decode_sequence_steps"] = gen["decode_sequence_steps"] * s_row
    notes = [f"generation scaled from the profile: decoding step x{s_step:.3g}, row in flight x{s_row:.3g}"]
    return StepTimeModel(coefficients, source, lengths, notes)


def published_l40s(logs_dir, n_config, m_config) -> list[dict]:
    """The published L40S GSM8K logs: calibrate on GRPO 16/16 and PODS 64/16, predict the arms of the
    n- and m-scaling configs. Rows: arm, n, m, role (measured / predicted), seconds per step."""
    experiments, _ = load_paper_logs(logs_dir, progress=False)
    gsm8k = next((e for e in experiments if "L40S" in e.hardware), None)
    if gsm8k is None:
        raise PodsBenchError(f"{logs_dir}: no single-GPU (L40S) logs")
    per_arm = gsm8k.step_times[gsm8k.step_times["phase"] == "total"].groupby("arm")["seconds_per_step"].mean()
    arms = gsm8k.arms.set_index("arm")
    measured = {(int(arms.loc[a, "n"]), int(arms.loc[a, "m"])): float(s) for a, s in per_arm.items()}
    lengths_by_arm = gsm8k.evals[(gsm8k.evals["metric"] == "mean_length") & (gsm8k.evals["benchmark"] == "gsm8k")]
    completion = float(lengths_by_arm["value"].mean())  # the training benchmark's test completions
    if (16, 16) not in measured or (64, 16) not in measured:
        raise PodsBenchError(f"{logs_dir}: the L40S logs lack GRPO 16/16 or PODS 64/16")
    resolved = {**resolve_arms(n_config), **resolve_arms(m_config)}
    by_nm = {(c.selection.n, c.selection.m): c for c in resolved.values()}
    cfg_a, cfg_b = by_nm[(16, 16)], by_nm[(64, 16)]
    # decoding runs to the longest completion of the step (the limit, assumed reached); an update row
    # is padded to its micro-batch's longest prompt + completion (assumed twice the mean completion)
    prompt = 200  # a GSM8K question with the instruct system prompt, in Qwen2.5 tokens (approximate)
    lengths = StepLengths(cfg_a.sampling.max_new_tokens, completion, prompt + 2 * completion)
    hardware = hardware_setup("l40s")
    source = f"l40s profile calibrated on the published GRPO 16/16 ({measured[(16, 16)]:.3g} s) and PODS 64/16 ({measured[(64, 16)]:.3g} s)"
    model = fit_two_arms(cfg_a, cfg_b, measured[(16, 16)], measured[(64, 16)], hardware, lengths, source)
    rows = []
    for (n, m), cfg in sorted(by_nm.items()):
        seconds = predict(model, cfg, 1, lengths)
        rows.append(
            {
                "n": n,
                "m": m,
                "role": "fitted" if (n, m) in measured else "predicted",
                "measured_s": round(measured[(n, m)], 3) if (n, m) in measured else None,
                "predicted_s": round(float(seconds["step"]), 3),
                "gen_s": round(float(seconds["gen"]), 3),
                "update_s": round(float(seconds["update"]), 3),
            }
        )
    return rows, model
