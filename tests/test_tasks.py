"""Benchmark tasks (registry, loading from a local folder in the hub schema, gold answers, errors,
the `pods-bench tasks` command) and prompt building with a locally built chat tokenizer."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from datetime import date, datetime
from pathlib import Path

import pytest

from pods_bench import cli
from pods_bench.errors import PodsBenchError
from pods_bench.tasks import DATA_DIR_ENV, TASKS, Problem, Task, get_task, load_problems, register_task
from pods_bench.tasks.hub import gsm8k_gold, number_text
from pods_bench.tasks.prompts import (
    FIXED_DATE,
    SYSTEM_PROMPT_BASE,
    SYSTEM_PROMPT_INSTRUCT,
    build_prompt,
    filter_by_prompt_length,
)

PAPER_TASKS = {
    "gsm8k": "openai/gsm8k",
    "math": "EleutherAI/hendrycks_math",
    "math500": "HuggingFaceH4/MATH-500",
    "amc23": "zwhe99/amc23",
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --- registry ------------------------------------------------------------------------------------


def test_registry_has_the_paper_tasks():
    for name, hub_id in PAPER_TASKS.items():
        assert get_task(name).name == name and hub_id in get_task(name).source
    assert get_task("math").source.count(",") == 6  # the 7 subject configs


def test_registry_accepts_new_tasks(monkeypatch):
    class Squares(Task):
        name, splits = "squares", ("test",)

        def load(self, split, data_dir=None):
            self.check_split(split)
            return [Problem(f"squares/{split}/{k}", f"What is {k}^2?", str(k * k)) for k in range(10)]

    monkeypatch.setitem(TASKS, "squares", Squares())
    assert [p.gold for p in load_problems("squares", "test", limit=3)] == ["0", "1", "4"]
    with pytest.raises(ValueError, match="already registered"):
        register_task(Squares())
    with pytest.raises(PodsBenchError, match="no split 'train'"):
        load_problems("squares", "train")


def test_unknown_task_is_named():
    with pytest.raises(PodsBenchError, match="unknown task 'nosuchtask'"):
        get_task("nosuchtask")


# --- loading the local copies -----------------------------------------------------------------


@pytest.mark.parametrize(
    "task, split, n_rows, first_id, first_gold",
    [
        ("gsm8k", "test", 1319, "gsm8k/test/0", "18"),
        ("gsm8k", "train", 7473, "gsm8k/train/0", "72"),
        ("math", "test", 5000, "math/test/0", "2"),
        ("math", "train", 7500, "math/train/0", "0"),
        ("math500", "test", 500, "math500/test/precalculus/807.json", r"\left( 3, \frac{\pi}{2} \right)"),
        ("amc23", "test", 40, "amc23/test/0", "27"),
    ],
)
def test_load_local_split(data_dir, task, split, n_rows, first_id, first_gold):
    problems = load_problems(task, split, data_dir)
    assert len(problems) == n_rows
    assert len({p.id for p in problems}) == n_rows  # ids are unique
    assert (problems[0].id, problems[0].gold) == (first_id, first_gold)
    assert all(p.question.strip() and p.gold for p in problems if p.id not in MATH_EMPTY_BOXES)
    assert load_problems(task, split, data_dir) == problems  # stable


# Two MATH train solutions end in an empty \boxed{} (a defect of the dataset itself).
MATH_EMPTY_BOXES = {"math/train/5529", "math/train/5531"}


def test_gold_answers(data_dir):
    gsm8k = load_problems("gsm8k", "train", data_dir)
    assert gsm8k[345].solution.endswith("#### 1,080") and gsm8k[345].gold == "1080"  # commas removed
    math_train = {p.id: p for p in load_problems("math", "train", data_dir)}
    assert math_train["math/train/1655"].gold == "2"  # "$\boxed 2$." has no braces
    assert math_train["math/train/1707"].gold == "9"
    assert {math_train[i].gold for i in MATH_EMPTY_BOXES} == {""}
    math_test = load_problems("math", "test", data_dir)
    assert math_test[372].gold == r"\frac{\sqrt{2}}{20}"  # nested braces kept whole
    math500 = load_problems("math500", "test", data_dir)
    rows = [json.loads(line) for line in gzip.open(data_dir / "math500" / "test.jsonl.gz", "rt")]
    assert [p.gold for p in math500] == [r["answer"] for r in rows]
    assert [p.id for p in math500] == [f"math500/{r['unique_id']}" for r in rows]
    amc = load_problems("amc23", "test", data_dir)
    assert [p.gold for p in amc[:4]] == ["27", "36", "45", "3159"] and amc[15].gold == "-1"


def test_gold_helpers():
    assert gsm8k_gold("so 3 + 4 = 7\n#### 1,234,567") == "1234567"
    assert gsm8k_gold("no final line") is None
    assert (
        number_text(27.0) == "27"
        and number_text(-1.0) == "-1"
        and number_text(2.5) == "2.5"
        and number_text(" 7 ") == "7"
    )


def test_limit(data_dir):
    assert [p.id for p in load_problems("amc23", "test", data_dir, limit=2)] == ["amc23/test/0", "amc23/test/1"]


def test_data_dir_from_the_environment(data_dir, monkeypatch, tmp_path):
    monkeypatch.setenv(DATA_DIR_ENV, str(data_dir))
    assert len(load_problems("amc23", "test")) == 40
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "elsewhere"))
    assert len(load_problems("amc23", "test", data_dir)) == 40  # an explicit data_dir wins


def test_hub_is_the_default_and_fails_cleanly_offline(monkeypatch):
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)  # tests run with HF_HUB_OFFLINE=1
    with pytest.raises(PodsBenchError, match="cannot load openai/gsm8k split 'test' from the hub") as e:
        load_problems("gsm8k", "test")
    assert "\n" not in str(e.value)


# --- bad input: one line naming what is wrong ---------------------------------------------------


def _error(data_dir, task="gsm8k", split="test") -> str:
    with pytest.raises(PodsBenchError) as e:
        load_problems(task, split, data_dir)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_missing_field(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q", "solution": "#### 1"}])
    message = _error(tmp_path)
    assert str(path) in message and "missing field 'answer'" in message


def test_empty_file(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("\n")
    assert "test.jsonl: empty file" in _error(tmp_path)
    (tmp_path / "amc23").mkdir()
    with gzip.open(tmp_path / "amc23" / "test.jsonl.gz", "wt") as f:
        f.write("")
    assert "test.jsonl.gz: empty file" in _error(tmp_path, "amc23")


def test_missing_file_and_folder(tmp_path):
    assert f"no file {tmp_path / 'gsm8k' / 'test'}.jsonl[.gz]" in _error(tmp_path)
    assert f"data folder {tmp_path / 'nope'} does not exist" in _error(tmp_path / "nope")


def test_malformed_rows(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    assert "test.jsonl: not valid JSON Lines" in _error(tmp_path)
    rows = [{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": "no marker"}]
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", rows)
    assert "gsm8k/test/1: answer has no '#### <final answer>' line" in _error(tmp_path)
    write_jsonl(
        tmp_path / "gsm8k" / "test.jsonl", [{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": None}]
    )
    assert "test.jsonl: row 1 has no value for field 'answer'" in _error(tmp_path)
    write_jsonl(tmp_path / "math" / "test.jsonl", [{"problem": "p", "solution": "no box"}])
    assert "math/test/0: solution has no \\boxed answer" in _error(tmp_path, "math")


def test_unknown_split(data_dir):
    assert "task 'math500' has no split 'train'" in _error(data_dir, "math500", "train")


# --- the command line -------------------------------------------------------------------------


def test_cli_lists_tasks(capsys):
    assert cli.main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name, hub_id in PAPER_TASKS.items():
        assert any(line.startswith(name) and hub_id in line for line in out.splitlines())


def test_cli_shows_problems(capsys, data_dir):
    assert cli.main(["tasks", "gsm8k", "--data-dir", str(data_dir), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "[gsm8k/test/0]" in out and "gold: 18" in out and "[gsm8k/test/1]" in out and "[gsm8k/test/2]" not in out


def test_cli_bad_input_is_one_line(capsys, tmp_path):
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q"}])
    assert cli.main(["tasks", "gsm8k", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pods-bench: error: ") and "missing field 'answer'" in err


@pytest.mark.parametrize(
    "argv, named",
    [(["tasks", "nosuchtask"], "nosuchtask"), (["tasks", "gsm8k", "--data-dir", "{empty}"], "test.jsonl")],
)
def test_cli_process_exit_status(tmp_path, argv, named):
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text("")
    argv = [a.replace("{empty}", str(tmp_path)) for a in argv]
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pods-bench"), *argv], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and named in out.stderr and "Traceback" not in out.stderr


# --- prompts --------------------------------------------------------------------------------------

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# What Llama 3.x templates do: print today's date unless told otherwise.
DATED = (
    "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "Today Date: {{ date_string }}\n" + CHATML
)
CLOCK = "Now: {{ strftime_now('%Y-%m-%d') }}\n" + CHATML  # a template that always reads the clock


def tiny_tokenizer(chat_template: str | None = CHATML):
    """A word-level tokenizer trained on a few lines, with a chat template; nothing downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    lines = [SYSTEM_PROMPT_INSTRUCT, SYSTEM_PROMPT_BASE, "What is 2 + 3 ? one two three four", "system user assistant"]
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>", chat_template=chat_template
    )


PROBLEM = Problem("demo/test/0", "What is 2 + 3?", "5")


def test_instruct_prompt():
    prompt = build_prompt(PROBLEM, tiny_tokenizer())
    system, user = (
        f"<|im_start|>system\n{SYSTEM_PROMPT_INSTRUCT}<|im_end|>\n",
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n",
    )
    assert prompt == system + user + "<|im_start|>assistant\n"
    custom = build_prompt(PROBLEM, tiny_tokenizer(), system_prompt="Be brief.")
    assert custom.startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_base_prompt_needs_no_tokenizer():
    assert build_prompt(PROBLEM, None, style="base") == f"{SYSTEM_PROMPT_BASE}Problem: What is 2 + 3?\nSolution: "


def test_prompt_errors():
    with pytest.raises(PodsBenchError, match="unknown prompt style 'chat'"):
        build_prompt(PROBLEM, tiny_tokenizer(), style="chat")
    with pytest.raises(PodsBenchError, match="chat template"):
        build_prompt(PROBLEM, tiny_tokenizer(chat_template=None))


@pytest.mark.parametrize("template", [DATED, CLOCK])
def test_prompts_do_not_depend_on_the_day(monkeypatch, template):
    import transformers.utils.chat_template_utils as chat_template_utils

    tokenizer = tiny_tokenizer(template)
    messages = [{"role": "user", "content": PROBLEM.question}]

    def on(day: datetime, render):
        class Clock(datetime):
            @classmethod
            def now(cls, tz=None):
                return day

        monkeypatch.setattr(chat_template_utils, "datetime", Clock)
        return render()

    days = [datetime(2026, 1, 2), datetime(2027, 12, 31)]
    raw = [
        on(d, lambda: tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        for d in days
    ]
    assert raw[0] != raw[1]  # the template really reads the clock
    built = [on(d, lambda: build_prompt(PROBLEM, tokenizer)) for d in days]
    assert built[0] == built[1]
    assert FIXED_DATE.strftime("%Y") in built[0] and datetime.now().strftime("%d %b %Y") not in built[0]
    # task.prompt_date picks the day (the paper's Llama runs printed 09 Sep 2025)
    dated = [on(d, lambda: build_prompt(PROBLEM, tokenizer, day=date(2025, 9, 9))) for d in days]
    assert dated[0] == dated[1] != built[0] and "2025" in dated[0] and FIXED_DATE.strftime("%Y") not in dated[0]


def test_filter_by_prompt_length():
    tokenizer = tiny_tokenizer()
    kept, dropped = filter_by_prompt_length(
        ["one two", "one two three four", "one", "one two three"], tokenizer, max_tokens=3
    )
    assert (kept, dropped) == ([0, 2, 3], 1)
    assert filter_by_prompt_length([], tokenizer, 3) == ([], 0)


def test_filter_rendered_prompts(data_dir):
    tokenizer = tiny_tokenizer()
    prompts = [build_prompt(p, tokenizer) for p in load_problems("math500", "test", data_dir)]
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    limit = sorted(lengths)[-4]  # keep all but the longest few
    kept, dropped = filter_by_prompt_length(prompts, tokenizer, limit)
    assert kept == [i for i, n in enumerate(lengths) if n <= limit] and dropped == 500 - len(kept) > 0
