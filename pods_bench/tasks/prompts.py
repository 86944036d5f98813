"""Prompts: how a problem is shown to the model.

- "instruct": the official PODS system prompt (think in `<think>`, answer in `<answer>`) and the
  question as the user turn, rendered with the tokenizer's chat template.
- "base": the official plain-text prompt for base models: the same instructions, then
  "Problem: <question>\\nSolution: ".

Prompts never depend on the day they are built: some chat templates print today's date (Llama 3.x
inserts "Today Date: ..." via `strftime_now` unless `date_string` is given), so rendering fixes both
to the task's `prompt_date` (default FIXED_DATE). A rerun of an experiment therefore sees
byte-identical prompts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime

from pods_bench.errors import PodsBenchError
from pods_bench.tasks.base import Problem

# Verbatim from the official code (github.com/YixuanEvenXu/pods, utils/data.py).
SYSTEM_PROMPT_INSTRUCT = """
You will be given a math question.
Reason about the question and correct your own mistakes if you make any.

Respond in the following format:
<think>
Reason here. Decide to answer when you are confident as your response length is limited.
</think>
<answer>
Answer here.
</answer>
"""

SYSTEM_PROMPT_BASE = """
An AI assistant is given a math problem and solves it step by step. The assistant first thinks about the reasoning process in the mind and then concludes the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., 
<think>
Reasoning
</think>
<answer>
Answer
</answer>
"""

# Llama 3.x templates' own fallback date; any fixed date would do.
FIXED_DATE = datetime(2024, 7, 26)


def instruct_prompt(problem: Problem, tokenizer, system_prompt: str | None = None, day: date | None = None) -> str:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise PodsBenchError(
            "instruct-style prompts need a tokenizer with a chat template (use style 'base' otherwise)"
        )
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT_INSTRUCT if system_prompt is None else system_prompt},
        {"role": "user", "content": problem.question},
    ]
    day = FIXED_DATE if day is None else datetime(day.year, day.month, day.day)
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
        # template variables: these override the date a template would otherwise read from the clock
        date_string=day.strftime("%d %b %Y"),
        strftime_now=day.strftime,
    )


def base_prompt(problem: Problem, tokenizer=None, system_prompt: str | None = None, day: date | None = None) -> str:
    instructions = SYSTEM_PROMPT_BASE if system_prompt is None else system_prompt
    return f"{instructions}Problem: {problem.question}\nSolution: "


PROMPT_STYLES: dict[str, Callable[..., str]] = {"instruct": instruct_prompt, "base": base_prompt}


def build_prompt(
    problem: Problem, tokenizer, style: str = "instruct", system_prompt: str | None = None, day: date | None = None
) -> str:
    if style not in PROMPT_STYLES:
        raise PodsBenchError(f"unknown prompt style {style!r} (known: {', '.join(PROMPT_STYLES)})")
    return PROMPT_STYLES[style](problem, tokenizer, system_prompt, day)


def filter_by_prompt_length(prompts: list[str], tokenizer, max_tokens: int) -> tuple[list[int], int]:
    """Indices of the prompts of at most `max_tokens` tokens, and how many were dropped (callers log
    it: the official code silently drops 4 of MATH-500's 500 problems at 512 tokens). Counts the
    prompt text as rendered; a chat template's special tokens are already in it."""
    lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]] if prompts else []
    kept = [i for i, n in enumerate(lengths) if n <= max_tokens]
    return kept, len(prompts) - len(kept)


def render_prompts(problems, tokenizer, task_cfg) -> list[str]:
    """Prompts exactly as the trainer renders them (the task config's style, system prompt and date)."""
    day = date.fromisoformat(task_cfg.prompt_date)
    return [build_prompt(p, tokenizer, task_cfg.prompt_style, task_cfg.system_prompt, day) for p in problems]
