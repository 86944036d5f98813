"""The `arith` smoke task: deterministic seeded generation, disjoint splits, correct answers (checked
by re-reading the question, and by the project's math-verify grader), short prompts."""

from __future__ import annotations

import re

import pytest

from pods_bench.errors import PodsBenchError
from pods_bench.models import build_char_tokenizer
from pods_bench.pretrain import PretrainConfig, render_prompt
from pods_bench.rewards import RewardConfig, RewardFunction
from pods_bench.tasks import get_task, load_problems
from pods_bench.tasks.arith import ADD_WORDS, MUL_WORDS, SUB_WORDS, ArithTask

SMOKE_MAX_NEW_TOKENS = 32  # config/smoke.yaml samples at most this many tokens per completion


@pytest.fixture(scope="module")
def splits():
    task = get_task("arith")
    return task.load("train"), task.load("test")


def think_of(solution: str) -> str:
    return re.fullmatch(r"<think>(.*)</think><answer>(.*)</answer>", solution).group(1)


def solve_from_question(question: str) -> int:
    """An independent reading of the question: start value, then one operation per clause."""
    m = re.fullmatch(r"[A-Z][a-z]+ has (\d+) [a-z]+, (.*)\. How many\?", question)
    assert m, question
    words = {w.split(" {b}")[0]: "+" for w in ADD_WORDS} | {w.split(" {b}")[0]: "-" for w in SUB_WORDS}
    value = int(m.group(1))
    for clause in m.group(2).split(", "):
        if clause in MUL_WORDS.values():
            value *= {text: b for b, text in MUL_WORDS.items()}[clause]
            continue
        verb, b = clause.rsplit(" ", 1)
        value = value + int(b) if words[verb] == "+" else value - int(b)
    return value


def test_registered_and_sized(splits):
    train, test = splits
    assert isinstance(get_task("arith"), ArithTask)
    assert len(train) == ArithTask.train_size and len(test) == ArithTask.test_size == 1000
    assert [p.id for p in load_problems("arith", "test", limit=2)] == ["arith/test/0", "arith/test/1"]
    assert len({p.question for p in test}) == len(test)  # no problem counted twice
    steps = {think_of(p.solution).count(";") + 1 for p in test}
    assert steps == {1, 2, 3}


def test_generation_is_deterministic_per_seed(splits):
    train, test = splits
    assert ArithTask().load("train") == train and ArithTask().load("test") == test
    other = ArithTask(seed=1)
    assert other.load("train") != train
    assert other.load("test") == test  # the test split is fixed, whatever the seed


def test_a_limit_generates_the_same_first_problems_alone(splits):
    """`task.limit` and `eval.n_problems` make only the first problems: the same problems, ids and
    order as the first of the whole split, also for the test split, whose generation skips repeated
    questions (a seed not loaded before, so that nothing comes from the cache)."""
    train, test = splits
    task = ArithTask(seed=5)
    assert task.load_first("train", 64) == task.load("train")[:64] and task.load_first("test", 300) == test[:300]
    assert task.load_first("test", 5000) == test  # a limit above the split's size: the whole split
    assert load_problems("arith", "train", limit=0) == []


def test_splits_are_disjoint_by_arithmetic(splits):
    train, test = splits
    assert not {think_of(p.solution) for p in train} & {think_of(p.solution) for p in test}
    assert not {p.question for p in train} & {p.question for p in test}
    assert not {think_of(p.solution) for p in ArithTask(seed=7, train_size=3000).load("train")} & {
        think_of(p.solution) for p in test
    }


def test_answers_are_correct(splits):
    train, test = splits
    task = get_task("arith")
    for p in test + train[:2000]:
        think = think_of(p.solution)
        assert int(p.gold) == solve_from_question(p.question), p
        prev = None
        for step in think.split(";"):
            a, op, b, result = re.fullmatch(r"(\d+)([-+*])(\d+)=(\d+)", step).groups()
            assert prev is None or a == prev  # each step continues from the last result
            assert int(result) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
            assert 0 <= int(result) <= task.max_value
            prev = result
        assert prev == p.gold and p.solution.endswith(f"<answer>{p.gold}</answer>")


def test_golds_verify_with_the_project_grader(splits):
    _, test = splits
    golds = [p.gold for p in test]
    with RewardFunction(RewardConfig(workers=0)) as reward:
        right = reward([p.solution for p in test], golds)
        wrong = reward(
            [re.sub(r"<answer>\d+</answer>", f"<answer>{int(p.gold) + 1}</answer>", p.solution) for p in test[:100]],
            golds[:100],
        )
    assert right.correctness.min() == 1 and right.format.min() == 1  # every worked solution is well-formed and right
    assert wrong.correctness.max() == 0  # and the grader does tell wrong answers apart


def test_prompts_and_completions_are_short(splits):
    """Every character is a decoding step (or a token of the update's forward pass) of the
    character-level smoke model."""
    _, test = splits
    tokenizer = build_char_tokenizer()
    cfg = PretrainConfig()
    prompt_lengths = [
        len(ids)
        for ids in tokenizer([render_prompt(cfg, p, tokenizer) for p in test], add_special_tokens=False)["input_ids"]
    ]
    completion_lengths = [
        len(ids) + 1 for ids in tokenizer([p.solution for p in test], add_special_tokens=False)["input_ids"]
    ]  # + EOS
    assert max(prompt_lengths) <= 100 and sum(prompt_lengths) / len(test) <= 80
    assert max(completion_lengths) <= SMOKE_MAX_NEW_TOKENS


def test_bad_input_is_a_one_line_error():
    with pytest.raises(PodsBenchError, match="no split 'validation'"):
        get_task("arith").load("validation")
    with pytest.raises(PodsBenchError, match="max_steps must be >= 1"):
        ArithTask(max_steps=0)
    with pytest.raises(PodsBenchError, match=r"min_steps must be <= max_steps \(3\), got 4"):
        ArithTask(min_steps=4)
    with pytest.raises(PodsBenchError, match="test_share"):
        ArithTask(test_share=1.0)
    with pytest.raises(PodsBenchError, match="cannot draw 500 distinct test problems"):
        ArithTask(max_steps=1, max_operand=1, max_value=2, test_size=500).load("test")


def test_arith_mix_has_longer_chains_within_the_strategies_completion_limit():
    """`arith-mix` (config/strategies.yaml): chains of 2 to 5 steps, each length about equally
    often in training, answers still correct, solutions within the benchmark's 48 new tokens."""
    import yaml

    from tests.test_workflow import CONFIG_DIR

    task = get_task("arith-mix")
    train, test = task.load("train"), task.load("test")
    steps = [think_of(p.solution).count(";") + 1 for p in train]
    assert set(steps) == {2, 3, 4, 5} and all(abs(steps.count(k) / len(steps) - 0.25) < 0.02 for k in range(2, 6))
    assert {think_of(p.solution).count(";") + 1 for p in test} == {2, 3, 4, 5}
    assert all(solve_from_question(p.question) == int(p.gold) for p in train[:2000] + test)
    settings = yaml.safe_load((CONFIG_DIR / "strategies.yaml").read_text())["train"]
    assert settings["task"]["limit"] == 64  # a pool small enough that prompts come back
    tokenizer = build_char_tokenizer()
    longest = max(len(ids) + 1 for ids in tokenizer([p.solution for p in test + train[:2000]])["input_ids"])
    assert longest <= settings["sampling"]["max_new_tokens"] == settings["eval"]["max_new_tokens"]


def solve_from_sentences(question: str) -> int:
    """An independent reading of an `arith-words` question: one sentence a step."""
    m = re.fullmatch(r"([A-Z][a-z]+) has (\d+) ([a-z]+)\. (.*) How many \3 does \1 have now\?", question)
    assert m, question
    value = int(m.group(2))
    for sentence in re.findall(r"Then [^.]*\.", m.group(4)):
        if sentence.endswith("doubles.") or sentence.endswith("triples."):
            value *= 2 if sentence.endswith("doubles.") else 3
        else:
            b = int(re.search(r"\d+", sentence).group())
            value = value + b if " buys " in sentence else value - b
    return value


def test_arith_words_phrases_its_chains_in_sentences():
    """`arith-words` (the real-model task, docs/real-model.md): one or two steps, full sentences,
    and answers that an independent reading of the sentences recomputes."""
    test = get_task("arith-words").load("test")
    assert {len(re.findall(r"Then ", p.question)) for p in test} == {1, 2}
    assert all(solve_from_sentences(p.question) == int(p.gold) for p in test)
    # held out by computation, as `arith`: no test chain's worked computation is ever trained on
    train = get_task("arith-words").load("train")
    assert not {think_of(p.solution) for p in train} & {think_of(p.solution) for p in test}
    with pytest.raises(PodsBenchError, match="phrasing must be 'terse' or 'sentences', got 'verse'"):
        ArithTask(phrasing="verse")
