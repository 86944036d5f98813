"""`arith`: procedurally generated arithmetic word problems that a tiny model learns on a CPU.

No downloadable model learns GSM8K on two CPU cores, so the smoke benchmark trains on a task a
~1M-parameter character-level model can learn in minutes, graded by the same verifier and written in
the same `<think>`/`<answer>` format as the real tasks:

    question  "Ann has 3 pens, buys 4, loses 2. How many?"
    solution  "<think>3+4=7;7-2=5</think><answer>5</answer>"
    gold      "5"

Every character is a decoding step for the character-level model, so questions and worked
solutions are kept short. A problem is a chain of one to three steps (+, -, x2/x3) on one-digit
operands; every intermediate value stays in 0..max_value. `arith-mix` (chains of two to five steps)
is the harder mix the allocation strategies are compared on. `arith-words` (one or two steps) says
the same chains in full English sentences, for a real pretrained model (docs/real-model.md):

    question  "Ann has 3 pens. Then Ann buys 4 more pens. How many pens does Ann have now?"

Splits are disjoint by arithmetic: a chain (its worked `think` string) belongs to the test split iff
a stable hash of it falls in the test share, so no test computation is ever trained on, whatever
the seeds; single facts such as 3+4 still appear inside longer training chains. One-step chains are
few (144), so the test's 231 one-step problems repeat 24 held-out chains under different names and
items. The test split is fixed (its own seed, no repeated question); the train split is drawn with
the task's seed.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import random
from dataclasses import dataclass

from pods_bench.errors import PodsBenchError
from pods_bench.tasks.base import Problem, Task, register_task

# Short words on purpose: every character is a decoding step or a token of the update's forward pass.
NAMES = ("Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal")
ITEMS = ("pens", "cats", "eggs", "cups", "hats", "toys", "bags", "jars")
# Phrasings per operation: the model has to map words to operations, as in a word problem.
ADD_WORDS = ("gets {b}", "buys {b}", "finds {b}")
SUB_WORDS = ("loses {b}", "sells {b}", "uses {b}")
MUL_WORDS = {2: "doubles", 3: "triples"}
# phrasing "sentences": one English sentence a step, as a chat model expects a word problem
SENTENCES = {"+": "Then {name} buys {b} more {item}.", "-": "Then {name} gives away {b} {item}."}
PHRASINGS = ("terse", "sentences")
APPLY = {"+": operator.add, "-": operator.sub, "*": operator.mul}

TEST_SEED = 1_000_003  # the test split never depends on the task's seed


@dataclass(frozen=True)
class Chain:
    """One problem's arithmetic: a start value and the steps applied to it."""

    start: int
    steps: tuple[tuple[str, int], ...]  # (operator "+", "-" or "*", operand)

    def values(self) -> list[int]:
        """Running values after each step (the last one is the answer)."""
        out, value = [], self.start
        for op, b in self.steps:
            value = APPLY[op](value, b)
            out.append(value)
        return out

    @property
    def answer(self) -> int:
        return self.values()[-1]

    def think(self) -> str:
        """The worked computation, e.g. "3+4=7;7-2=5"."""
        parts, prev = [], self.start
        for (op, b), value in zip(self.steps, self.values()):
            parts.append(f"{prev}{op}{b}={value}")
            prev = value
        return ";".join(parts)


def solution_text(think: str, answer: int | str) -> str:
    """A completion in the project's answer format."""
    return f"<think>{think}</think><answer>{answer}</answer>"


@dataclass(frozen=True)
class ArithTask(Task):
    name: str = "arith"
    splits: tuple[str, ...] = ("train", "test")
    seed: int = 0  # seeds the train split
    train_size: int = 20_000  # the warm start draws 480 x 64 samples: each problem ~1.5 times; generated in ~0.6 s
    test_size: int = 1_000
    min_steps: int = 1  # a chain has min_steps..max_steps steps, uniformly
    max_steps: int = 3
    max_operand: int = 9
    max_value: int = 99  # every running value stays in 0..max_value (answers have <= 2 digits)
    test_share: float = 0.2  # share of all chains held out for the test split
    phrasing: str = "terse"  # "terse" (few characters) or "sentences" (full English, for real models)

    def __post_init__(self):
        for key in ("train_size", "test_size", "min_steps", "max_steps", "max_operand"):
            if getattr(self, key) < 1:
                raise PodsBenchError(f"task {self.name!r}: {key} must be >= 1, got {getattr(self, key)}")
        if self.min_steps > self.max_steps:
            raise PodsBenchError(
                f"task {self.name!r}: min_steps must be <= max_steps ({self.max_steps}), got {self.min_steps}"
            )
        if self.max_value < self.max_operand + 1:
            raise PodsBenchError(
                f"task {self.name!r}: max_value must be > max_operand ({self.max_operand}), got {self.max_value}"
            )
        if self.phrasing not in PHRASINGS:
            raise PodsBenchError(
                f"task {self.name!r}: phrasing must be {' or '.join(map(repr, PHRASINGS))}, got {self.phrasing!r}"
            )
        if not 0 < self.test_share < 1:
            raise PodsBenchError(f"task {self.name!r}: test_share must be in (0, 1), got {self.test_share}")

    def load(self, split: str, data_dir=None) -> list[Problem]:
        return self.load_first(split, None)

    def load_first(self, split: str, count: int | None, data_dir=None) -> list[Problem]:
        """`data_dir` is ignored: problems are generated, not read. Generation is sequential, so the
        first `count` problems are generated alone: a run on `task.limit` problems, or an evaluation of
        `eval.n_problems`, skips the rest of the ~20,000 (~0.6 s in every process that loads them)."""
        self.check_split(split)
        size = self.size_of(split)
        return list(self._generated(split, size if count is None else min(count, size)))

    def size_of(self, split: str) -> int:
        return self.test_size if split == "test" else self.train_size

    @functools.lru_cache(maxsize=16)  # noqa: B019 (tasks are few, frozen and live as long as the process)
    def _generated(self, split: str, count: int) -> tuple[Problem, ...]:
        """The split's first `count` problems, generated once per process (a process that trains and
        evaluates, or a test process that trains many runs, loads them again and again)."""
        if split == "test":
            return tuple(self._generate("test", count, TEST_SEED, unique=True))
        return tuple(self._generate("train", count, self.seed, unique=False))

    @property
    def source(self) -> str:
        return f"generated (pods_bench.tasks.arith; train seed {self.seed}, fixed test)"

    # --- generation ------------------------------------------------------------------------

    def sample_chain(self, rng: random.Random) -> Chain:
        value = rng.randint(1, self.max_operand)
        start, steps = value, []
        for _ in range(rng.randint(self.min_steps, self.max_steps)):
            # the operands each operator allows from `value` (ranges, not lists: this runs ~60,000
            # times per split loaded, in every process that loads the task)
            operands = {
                "*": [b for b in MUL_WORDS if 0 < value and value * b <= self.max_value],
                "+": range(1, min(self.max_operand, self.max_value - value) + 1),
                "-": range(1, min(self.max_operand, value) + 1),
            }
            op = rng.choice([o for o in sorted(operands) if operands[o]])  # operator first: each equally likely
            b = rng.choice(operands[op])
            steps.append((op, b))
            value = APPLY[op](value, b)
        return Chain(start, tuple(steps))

    def split_of(self, chain: Chain) -> str:
        """Stable (process-independent) assignment of a chain to a split."""
        digest = hashlib.sha256(chain.think().encode()).digest()
        return "test" if int.from_bytes(digest[:8], "big") < self.test_share * 2**64 else "train"

    def question(self, chain: Chain, rng: random.Random) -> str:
        if self.phrasing == "sentences":
            name, item = rng.choice(NAMES), rng.choice(ITEMS)
            said = [f"{name} has {chain.start} {item}."]
            for op, b in chain.steps:
                said.append(
                    f"Then the number of {item} {MUL_WORDS[b]}."
                    if op == "*"
                    else SENTENCES[op].format(name=name, b=b, item=item)
                )
            return " ".join(said + [f"How many {item} does {name} have now?"])
        words = {"+": ADD_WORDS, "-": SUB_WORDS}
        clauses = [MUL_WORDS[b] if op == "*" else rng.choice(words[op]).format(b=b) for op, b in chain.steps]
        return f"{rng.choice(NAMES)} has {chain.start} {rng.choice(ITEMS)}, {', '.join(clauses)}. How many?"

    def _generate(self, split: str, count: int, seed: int, unique: bool) -> list[Problem]:
        rng = random.Random(f"{self.name}-{split}-{seed}")
        problems: list[Problem] = []
        seen: set[str] = set()
        # a too-small problem space fails loudly instead of looping (bounded by the whole split's size,
        # so that a prefix never fails where the whole split would not)
        attempts, max_attempts = 0, 100 * self.size_of(split)
        while len(problems) < count:
            attempts += 1
            if attempts > max_attempts:
                raise PodsBenchError(
                    f"task {self.name!r}: cannot draw {count} distinct {split} problems; lower the size"
                )
            chain = self.sample_chain(rng)
            if self.split_of(chain) != split:
                continue
            question = self.question(chain, rng)
            if unique and question in seen:
                continue
            seen.add(question)
            problems.append(
                Problem(
                    id=f"{self.name}/{split}/{len(problems)}",
                    question=question,
                    gold=str(chain.answer),
                    solution=solution_text(chain.think(), chain.answer),
                )
            )
        return problems


register_task(ArithTask())
# The strategies' task (docs/allocation.md#the-difficulty-mix-task-arith-mix): chains of 2 to 5 steps,
# longer than the warm start saw (1 to 3), so that at the start about 40 % of 16-rollout groups are
# all wrong and the rest spread over the pass rates. Its solutions are at most 44 tokens;
# config/strategies.yaml trains on the first 64 problems (task.limit), so that prompts come back.
register_task(ArithTask(name="arith-mix", min_steps=2, max_steps=5))
# The real-model task (docs/real-model.md): SmolLM2-135M-Instruct answers ~14 %
# of these right at the start, and about 40 % of 8-rollout groups are mixed.
register_task(ArithTask(name="arith-words", min_steps=1, max_steps=2, phrasing="sentences"))
