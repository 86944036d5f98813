"""Per-prompt pass rates of a policy on its training prompts: how many groups would be all-correct,
all-wrong or mixed. Allocation strategies (pods_bench/allocation/) only differ where prompts differ
in difficulty, so this is the first thing to look at before comparing them on a task.

    pods-bench pass-rates --config results/smoke/configs/train.yaml --prompts 500 --rollouts 16

Samples `rollouts` completions of each of the first `prompts` training prompts with the trainer's
own engine, sampling settings and grader (math-verify), as the config renders them, and writes one
CSV row per prompt (prompt index, correct count) plus a Markdown summary.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from pods_bench import checkpoint as ckpt
from pods_bench.engines import make_engine
from pods_bench.io import atomic_write_text, atomic_write_with
from pods_bench.rewards import RewardFunction, gold_texts
from pods_bench.sampling import load_training_prompts


def sample_pass_counts(cfg, prompts: int, rollouts: int, batch: int = 16, progress: bool = True) -> pd.DataFrame:
    """One row per training prompt: `prompt`, `correct` (of `rollouts`), `reward_mean`."""
    from tqdm.auto import tqdm

    policy, tokenizer = ckpt.load_policy(cfg)
    policy.eval()
    problems, texts, _ = load_training_prompts(cfg.task, cfg.data_dir, tokenizer)
    count = min(prompts, len(problems))
    engine = make_engine(cfg, policy, tokenizer)
    rows = []
    with RewardFunction(cfg.reward) as reward:
        for start in tqdm(range(0, count, batch), disable=not progress, desc="pass rates", unit="batch"):
            index = list(range(start, min(start + batch, count)))
            sampling = replace(cfg.sampling, seed=cfg.seed + start)
            out = engine.generate([texts[i] for i in index], rollouts, sampling)
            golds = gold_texts([problems[i] for i in index], cfg.reward.grading)
            graded = reward([t for g in out.completion_text for t in g], [g for g in golds for _ in range(rollouts)])
            correct = np.asarray(graded.correctness).reshape(len(index), rollouts)
            total = np.asarray(graded.total).reshape(len(index), rollouts)
            rows += [
                {"prompt": i, "correct": int(c.sum()), "reward_mean": float(t.mean())}
                for i, c, t in zip(index, correct, total)
            ]
    engine.close()
    return pd.DataFrame(rows)


def summary(counts: pd.DataFrame, rollouts: int) -> str:
    """Markdown: the share of prompts by correct count, and the all-wrong / mixed / all-correct split."""
    k = counts["correct"]
    split = pd.DataFrame(
        {
            "groups": ["all wrong (0 / n)", "mixed", "all correct (n / n)"],
            "prompts": [int((k == 0).sum()), int(((k > 0) & (k < rollouts)).sum()), int((k == rollouts).sum())],
        }
    )
    split["share"] = (split["prompts"] / len(k)).map("{:.1%}".format)
    histogram = k.value_counts().reindex(range(rollouts + 1), fill_value=0)
    bins = pd.DataFrame({"correct of n": histogram.index, "prompts": histogram.values})
    lines = [
        f"{len(k)} training prompts, n = {rollouts} rollouts each; mean pass rate {k.mean() / rollouts:.3f}",
        "",
        split.to_markdown(index=False),
        "",
        bins.to_markdown(index=False),
    ]
    return "\n".join(lines) + "\n"


def write(counts: pd.DataFrame, rollouts: int, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv, md = out / "pass_rates.csv", out / "pass_rates.md"
    atomic_write_with(csv, lambda path: counts.to_csv(path, index=False))
    atomic_write_text(md, summary(counts, rollouts))
    return [csv, md]
