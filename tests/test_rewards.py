"""Verifier rewards: answer extraction, math-verify grading, format shaping, and the grading pool's
timeouts, counters and process hygiene. All grading here is real math-verify in real processes."""

from __future__ import annotations

import gc
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pods_bench.errors import PodsBenchError
from pods_bench.rewards import (
    RewardConfig,
    RewardFunction,
    _format_span,
    extract_answer,
    format_correct,
    format_score,
    last_boxed,
    open_r1_format_score,
    open_r1_tag_score,
    tag_score,
)
from pods_bench.tasks import load_problems

PERFECT = "<think>\nreason\n</think>\n<answer>\n{}\n</answer>"


@pytest.fixture(scope="module")
def reward():
    """A pool with a patient 5 s timeout: these tests check what is graded correct, and a loaded
    CI machine must not turn a slow parse into a failure. The fuzz test uses the default 1 s."""
    with RewardFunction(RewardConfig(workers=2, timeout_s=5)) as r:
        yield r


def _state(pid: int) -> str | None:
    """The process state letter from /proc (R, S, D, Z, ...), None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    return _state(pid) not in (None, "Z", "X")


def _wait_gone(pids, seconds=30.0) -> dict[int, str]:
    """Wait for the processes to end; those still alive afterwards, with their states."""
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {p: _state(p) for p in pids if _alive(p)}


# --- extraction ------------------------------------------------------------------------------


def test_last_boxed_keeps_nested_braces():
    # the official extractor cuts at the first "}" and returns "\frac{\sqrt{3"
    assert last_boxed(r"so $x = \boxed{\frac{\sqrt{3}}{2}}$.") == r"\frac{\sqrt{3}}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{\left( 3, \frac{\pi}{2} \right)}") == r"\left( 3, \frac{\pi}{2} \right)"
    assert last_boxed(r"\boxed{\{1,2\}}") == r"\{1,2\}"  # escaped braces are set braces, not groups


def test_last_boxed_forms():
    assert last_boxed(r"our answer is $\boxed 2$.") == "2"  # brace-less, as in two MATH train solutions
    assert last_boxed(r"= \boxed {17}.$$") == "17"
    assert last_boxed(r"\boxed{3} and then \boxed{4") == "3"  # a truncated last box is skipped
    assert last_boxed("no box here") is None
    assert last_boxed(r"\boxedfoo{1}") is None
    deep = "\\boxed{" * 5000 + "1" + "}" * 5000
    assert last_boxed(deep) == "1"
    assert last_boxed("{" * 5000 + r"\boxed{" + "{" * 5000) is None


def test_extract_answer_order():
    assert extract_answer(r"\boxed{73} so <answer>72</answer>") == "72"  # the answer block wins
    assert extract_answer(r"<answer>The answer is \boxed{72}.</answer>") == "72"  # its box, if any
    assert extract_answer(r"<answer>1</answer> ... <answer>2</answer>") == "2"  # the last block
    assert extract_answer(r"<answer>unclosed 5 \boxed{6}") == "6"  # no complete block: last box
    assert extract_answer("it costs 3 or 1,000.") == "1,000"  # else the last number
    assert extract_answer("x = -2.5") == "-2.5"
    assert extract_answer("<answer> </answer> no digits") is None
    assert extract_answer("") is None


# --- correctness -------------------------------------------------------------------------------

CORRECTNESS_CASES = [
    # (completion, gold, expected)
    ("The answer is $72.", "72", 1),
    (r"\boxed{72}", "72", 1),
    ("<answer>72</answer>", "72", 1),
    ("#### 72", "72", 1),
    ("so the total is 70 + 2 = 72", "72", 1),
    ("<answer>$72</answer>", "72", 1),
    (r"<answer>72 \text{ dollars}</answer>", "72", 1),
    (r"<answer>\$72</answer>", "72", 1),
    (r"<answer>The total is $\frac{144}{2}$ dollars.</answer>", "72", 1),  # its own $...$ kept
    ("1,000", "1000", 1),
    ("<answer>$1,000</answer>", "1000", 1),
    ("The answer is $73.", "72", 0),
    (r"<answer>72</answer> \boxed{73}", "73", 0),  # the answer block decides, not the box
    (r"\boxed{73} <answer>72</answer>", "72", 1),
    ("0.5", r"\frac{1}{2}", 1),
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1),
    (r"<answer>\dfrac12</answer>", "0.5", 1),  # bare \dfrac12 only parses once wrapped in $...$
    ("<answer>1/2</answer>", r"\frac{1}{2}", 1),
    (r"\boxed{0.6}", r"\frac{1}{2}", 0),
    (r"\boxed{\sqrt{18}}", r"3\sqrt{2}", 1),
    (r"<answer>\sqrt{18}</answer>", r"3\sqrt{2}", 1),
    (r"\boxed{2\sqrt{3}}", r"3\sqrt{2}", 0),
    ("<answer>4.24</answer>", r"3\sqrt{2}", 0),
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1),
    (r"\boxed{\frac{\sqrt{3}}{3}}", r"\frac{\sqrt{3}}{2}", 0),  # equal if braces were truncated
    (r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", 1),
    (r"<answer>\text{(C)}</answer>", r"\text{(C)}", 1),
    (r"<answer>\frac{1}{2</answer>", r"\frac{1}{2}", 0),  # unbalanced braces: not parsed, wrong
    ("", "72", 0),
    ("no answer at all", "72", 0),
    ("<answer>72</answer>", "", 0),
]


def test_correctness_cases(reward):
    completions, golds, expected = zip(*CORRECTNESS_CASES)
    result = reward(list(completions), list(golds))
    wrong = [case for case, got in zip(CORRECTNESS_CASES, result.correctness) if got != case[2]]
    assert wrong == []
    assert result.n_timeouts == 0 and result.n_errors == 0


def test_in_process_grading_agrees_with_the_pool(reward):
    completions, golds, _ = zip(*CORRECTNESS_CASES)
    with RewardFunction(RewardConfig(workers=0)) as here:
        in_process = here(list(completions), list(golds))
    assert here.worker_pids() == []  # workers=0 never starts a process
    assert np.array_equal(in_process.correctness, reward(list(completions), list(golds)).correctness)


def test_in_process_grading_needs_the_main_thread():
    errors = []

    def run():
        try:
            RewardFunction(RewardConfig(workers=0))(["72"], ["72"])
        except PodsBenchError as e:
            errors.append(str(e))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors and "main thread" in errors[0]


def test_verifier_errors_are_counted(reward):
    # math-verify raises (and swallows) inside the comparison of a clock time with these
    result = reward(
        ["<answer>zoo</answer>", r"<answer>\frac{1}{0}</answer>", r"<answer>05\!:\!00</answer>"], [r"05\!:\!00"] * 3
    )
    assert list(result.correctness) == [0, 0, 1]
    assert result.n_errors == 2 and result.n_timeouts == 0


# --- format shaping ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, fmt, tags",
    [
        (PERFECT.format(72), 1.0, 1.0),
        ("<think>r</think><answer>72</answer>", 1.0, 1.0),
        ("<think>r</think> <answer>72</answer>", 1.0, 1.0),
        ("Sure! " + PERFECT.format(72), 0.94, 1.0),  # 0.01 off per character outside the blocks
        (PERFECT.format(72) + "x" * 150, 0.0, 1.0),  # floored at 0
        ("<think>r</think>\n\n<answer>72</answer>", 0.0, 1.0),  # at most one separator
        ("<answer>72</answer><think>r</think>", 0.0, 1.0),  # wrong order
        ("<answer>72</answer>", 0.0, 0.5),
        ("<think>a</think><think>b</think><answer>72</answer>", 1.0, 0.5),  # doubled tags earn nothing
        ("<think>a</think><answer>72", 0.0, 0.75),
        ("", 0.0, 0.0),
    ],
)
def test_format_and_tag_scores(completion, fmt, tags):
    assert format_score(completion) == pytest.approx(fmt)
    assert tag_score(completion) == pytest.approx(tags)


def test_total_is_the_weighted_sum(reward):
    completions = [PERFECT.format(72), PERFECT.format(73), r"\boxed{72}", "Sure! " + PERFECT.format(72)]
    result = reward(completions, ["72"] * 4)
    assert np.allclose(result.correctness, [1, 0, 1, 1])
    assert np.allclose(result.total, [1.2, 0.2, 1.0, 1.0 + 0.1 * 0.94 + 0.1])


@pytest.mark.parametrize(
    "weights, expected",
    [
        (dict(format_weight=0.0, tag_weight=0.0), [1.0, 0.0]),  # correctness only
        (dict(correctness_weight=0.0), [0.2, 0.2]),  # shaping only
        (dict(correctness_weight=2.0, format_weight=0.5, tag_weight=0.0), [2.5, 0.5]),
    ],
)
def test_weights_turn_components_on_and_off(weights, expected):
    with RewardFunction(RewardConfig(workers=0, **weights)) as r:
        result = r([PERFECT.format(72), PERFECT.format(73)], ["72", "72"])
    assert np.allclose(result.total, expected)
    assert np.allclose(result.correctness, [1, 0])  # components are always reported, unweighted
    assert np.allclose(result.format, [1, 1]) and np.allclose(result.tags, [1, 1])


@pytest.mark.parametrize(
    "completion, fmt, tags",
    [
        (PERFECT.format(72), 1.0, 1.0),
        (PERFECT.format(72) + "\nthanks", 1.0, 1.0),  # MULTILINE `$`: later lines are allowed
        ("<think>r</think><answer>72</answer>", 0.0, 0.0),  # newlines around every tag are required
        ("Sure!\n" + PERFECT.format(72), 0.0, 1.0),
        ("<think>\nr\n</think>\n<answer>\n72</answer>", 0.0, 0.75),
    ],
)
def test_open_r1_format_style(completion, fmt, tags):
    assert open_r1_format_score(completion) == fmt and open_r1_tag_score(completion) == tags


def test_format_style_is_configurable():
    completions = ["<think>r</think><answer>72</answer>"]
    with RewardFunction(RewardConfig(workers=0, format_weight=1.0, tag_weight=1.0, format_style="open-r1")) as r:
        assert r(completions, ["72"]).total[0] == 1.0  # correct, but no open-r1 format or tags
    with RewardFunction(RewardConfig(workers=0, format_weight=1.0, tag_weight=1.0)) as r:
        assert r(completions, ["72"]).total[0] == 3.0
    with pytest.raises(PodsBenchError, match="format_style 'xml'"):
        RewardConfig(format_style="xml")


# The linear-time scans must agree with the official regexes they replace.
OFFICIAL_FORMAT = re.compile(r"<think>.*</think>[ \n]?<answer>.*</answer>", re.DOTALL)
OFFICIAL_FORMAT_CORRECT = re.compile(r"^[ \n]?<think>.*</think>[ \n]?<answer>.*</answer>[ \n]?$", re.DOTALL)
PIECE = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        " ",
        "\n",
        "x",
        "<",
        "<think>\n",
        "\n</think>\n<answer>\n",
        "\n</answer>",
    ]
)
PIECES = st.lists(PIECE, max_size=12).map("".join)


@settings(max_examples=400, deadline=None)
@given(PIECES)
def test_format_span_matches_the_official_regex(text):
    match = OFFICIAL_FORMAT.search(text)
    assert _format_span(text) == (match.span() if match else None)


@settings(max_examples=400, deadline=None)
@given(PIECES)
def test_format_correct_matches_the_official_regex(text):
    assert format_correct(text) == bool(OFFICIAL_FORMAT_CORRECT.match(text))


OPEN_R1_FORMAT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL | re.MULTILINE)


@settings(max_examples=400, deadline=None)
@given(PIECES)
def test_open_r1_format_matches_the_official_regex(text):
    assert open_r1_format_score(text) == float(bool(OPEN_R1_FORMAT.match(text)))


# --- robustness: timeouts, crashes, process hygiene --------------------------------------------


def adversarial_items() -> list[str]:
    """Completions built to hang or crash a verifier, each in several positions."""
    payloads = [
        "2^{2^{2^{2^{2^{2}}}}}",
        "10^{9}!",
        "10^{10^{10}}",
        "(x+1)^{2000}",
        "2^{1000000000}",
        "9" * 5000,
        "{" * 5000 + "1" + "}" * 5000,
        "{" * 5000,
        "\\frac{" * 300 + "1" + "}{2}" * 300,
        "(" * 5000 + "1" + ")" * 5000,
        "\\sqrt{" * 500 + "2" + "}" * 500,
        "+".join(["x"] * 10000),
        r"\input{/etc/passwd}",
        r"\write18{rm -rf /}",
        r"\immediate\write18{ls}",
        "",
        "\x00" * 100,
        "ñ∑∫√π😀" * 100,
        "\ud800",  # a lone surrogate
        "x" * (1 << 20),  # 1 MB
        "<answer>" * 100_000,  # 800 KB of unclosed tags
        "1 " * 100_000,
    ]
    positions = [
        lambda s: s,
        lambda s: f"<answer>{s}</answer>",
        lambda s: f"\\boxed{{{s}}}",
        lambda s: f"<think>{s}</think>\n<answer>\n\\boxed{{{s}}}\n</answer>",
        lambda s: f"<answer>{s[:200]}</answer>",
    ]
    return [position(p) for p in payloads for position in positions]


def test_fuzz_adversarial_completions_finish_within_the_deadline():
    items = adversarial_items()
    config = RewardConfig()  # the defaults: 1 s math-verify timeouts, 8 s hard deadline per item
    with RewardFunction(config) as reward:
        reward(["72"], ["72"])  # start the pool
        started = time.monotonic()
        result = reward(items, ["7"] * len(items))  # nothing here equals 7
        wall = time.monotonic() - started
    print(
        f"fuzz: {len(items)} items in {wall:.1f} s, max item {result.seconds.max():.2f} s, "
        f"{result.n_timeouts} timeouts, {result.n_errors} errors, {reward.worker_restarts} worker restarts"
    )
    assert len(result.total) == len(items) and not result.correctness.any()
    assert result.seconds.max() <= config.item_deadline_s + 1.0  # the hard per-item bound, plus kill latency
    assert wall <= math.ceil(len(items) / config.workers) * config.item_deadline_s  # the per-call bound
    assert result.n_timeouts >= 5  # the power towers: math-verify's timeouts are seen and counted
    assert np.all((result.total >= 0) & (result.total <= 1.2))


def test_a_stuck_worker_is_killed_and_replaced():
    config = RewardConfig(workers=1, deadline_s=0.5)  # math-verify's own 1 s timeout comes too late
    with RewardFunction(config) as r:
        result = r([r"\boxed{72}", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", "<answer>72</answer>"], ["72", "72", "72"])
        assert list(result.correctness) == [1, 0, 1]
        assert result.n_timeouts == 1 and result.n_killed == 1 and r.worker_restarts >= 1
        assert result.seconds[1] <= 0.5 + 1.0
        replaced = r.worker_pids()
    assert _wait_gone(replaced) == {}


def test_a_dead_worker_is_replaced(reward):
    for pid in reward.worker_pids():
        os.kill(pid, signal.SIGKILL)
    assert _wait_gone(reward.worker_pids()) == {}
    result = reward([r"\boxed{72}"] * 8, ["72"] * 8)
    assert result.correctness.all()


def test_close_stops_every_worker():
    r = RewardFunction(RewardConfig(workers=2))
    assert r.worker_pids() == []  # started on first use
    r(["72"], ["72"])
    pids = r.worker_pids()
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    r.close()
    r.close()  # idempotent
    assert _wait_gone(pids) == {}


def test_garbage_collection_stops_workers():
    r = RewardFunction(RewardConfig(workers=1))
    r(["72"], ["72"])
    pids = r.worker_pids()
    del r
    gc.collect()
    assert _wait_gone(pids) == {}


def test_unguarded_main_script_gets_a_clear_error(tmp_path):
    script = tmp_path / "unguarded.py"  # forkserver workers re-import the main script
    message = tmp_path / "message.txt"
    # The re-imported script in the worker prints multiprocessing's own error too, and the two
    # processes' stderr interleave, even within a line: the main process writes its error to a file.
    script.write_text(
        "import multiprocessing\n"
        "from pods_bench.errors import PodsBenchError\n"
        "from pods_bench.rewards import RewardFunction\n"
        "try:\n"
        "    RewardFunction()(['72'], ['72'])\n"
        "except PodsBenchError as e:\n"
        "    if multiprocessing.parent_process() is None:\n"
        f"        open({str(message)!r}, 'w').write(str(e))\n"
        "    raise\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert message.read_text() == (
        "a reward grading process failed to start; with start method 'forkserver' or 'spawn' the main script "
        "must guard its code with `if __name__ == '__main__':`"
    ), out.stderr[-2000:]


def test_interpreter_exit_stops_workers(tmp_path):
    script = tmp_path / "no_close.py"
    script.write_text(
        "from pods_bench.rewards import RewardFunction, RewardConfig\n"
        "if __name__ == '__main__':\n"
        "    r = RewardFunction(RewardConfig(workers=2))\n"
        "    assert r(['72'], ['72']).correctness[0] == 1\n"
        "    print(*r.worker_pids())\n"  # exits without close()
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    assert _wait_gone(pids) == {}


# --- every gold answer of the benchmarks verifies against itself --------------------------------


@pytest.mark.parametrize(
    "task, split, min_rate",
    [
        ("gsm8k", "test", 1.0),
        ("gsm8k", "train", 1.0),
        ("math500", "test", 1.0),
        ("amc23", "test", 1.0),
        ("math", "test", 0.99),
        # two train solutions end in an empty \boxed{}: their gold is "", graded wrong by design
        ("math", "train", 0.99),
    ],
)
def test_gold_answers_verify_against_themselves(reward, data_dir, task, split, min_rate):
    problems = load_problems(task, split, data_dir)
    result = reward([PERFECT.format(p.gold) for p in problems], [p.gold for p in problems])
    rate = result.correctness.mean()
    failed = [(p.id, p.gold) for p, ok in zip(problems, result.correctness) if not ok]
    print(f"{task}/{split}: {rate:.4%} of {len(problems)} golds self-verify; failures: {failed[:10]}")
    assert rate >= min_rate, failed[:20]
    assert np.allclose(result.total, result.correctness + 0.2)  # PERFECT has full format and tags
