"""`eval.max_prompt_tokens`: the paper scored only problems whose prompt fits 512 tokens
(3fc107e:utils/data.py:L70-74, applied to MATH-500 at L194: 496 of 500 with Qwen2.5's tokenizer)."""

from __future__ import annotations

import pytest

from pods_bench.config import config_from_dict
from pods_bench.errors import PodsBenchError
from pods_bench.evaluate import load_benchmarks
from pods_bench.models import build_char_tokenizer
from tests.tiny_runs import tiny_run


def test_evaluation_scores_only_prompts_that_fit(tmp_path, data_dir):
    tokenizer = build_char_tokenizer()
    settings = dict(data_dir=str(data_dir), eval={"benchmarks": ["math500"], "n_problems": None})
    everything = load_benchmarks(config_from_dict(tiny_run(tmp_path, **settings)), tokenizer)[0]
    lengths = sorted(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in everything.prompts)
    limit = lengths[len(lengths) * 3 // 4]  # about a quarter of the prompts are longer
    settings["eval"]["max_prompt_tokens"] = limit
    fitting = load_benchmarks(config_from_dict(tiny_run(tmp_path, **settings)), tokenizer)[0]
    assert len(everything.problems) == 500
    assert len(fitting.problems) == sum(n <= limit for n in lengths) < 500
    assert all(len(tokenizer(p, add_special_tokens=False)["input_ids"]) <= limit for p in fitting.prompts)
    settings["eval"]["max_prompt_tokens"] = 1
    with pytest.raises(PodsBenchError, match="no prompt of benchmark 'math500' fits eval.max_prompt_tokens=1"):
        load_benchmarks(config_from_dict(tiny_run(tmp_path, **settings)), tokenizer)
