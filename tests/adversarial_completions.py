"""Adversarial completions for the reward function, each with its gold answer and the grade it must get.

`adversarial_completions(seed)` builds about 2,000 completions in eight families:

    power_tower   2^{2^{2^{...}}} (exact ones, and ones no machine can evaluate), 10^{10^{10}}
    factorial     n! that are exact, 100000!, 10^{9}!, (10^{6})!
    deep_braces   5,000-deep braces, balanced and unbalanced both ways, around and before the answer
    megabyte      1 MB strings: digits, repeated tags, repeated \\boxed{, invisible characters, emoji
    unicode       RTL marks, zero-width joiners, BOM, NUL and control characters, emoji, combining
                  marks, lone surrogates, full-width and Arabic-Indic digits, glued to or near the answer
    injection     \\input{/etc/passwd}, \\write18{rm -rf /}, \\def, \\catcode, \\csname, \\immediate, ...
    empty         empty and whitespace-only completions, empty tags and boxes, empty gold
    decoy         a WRONG answer hidden next to the gold: gold in <think> and wrong in <answer>, gold in
                  an earlier \\boxed{} or <answer>, prefixes (12 vs 125), hedges; and equal forms on
                  purpose (0.5 vs \\frac{1}{2}, 1,000 vs 1000, \\sqrt{18} vs 3\\sqrt{2})

Labels. An item is labelled correct only when the extraction rules of `pods_bench.rewards` (the last
complete `<answer>` block, its last `\\boxed{}` if it has one; else the last complete `\\boxed{}`;
else the last number; longer than `max_answer_chars` or with unbalanced braces: wrong) pick out an
answer that is mathematically equal to the gold. Everything else is labelled wrong. Where the label
is not plain from the construction, `why` says why.

Size. The items that run into math-verify's 1 s timeouts (towers it cannot evaluate, 10^{9}!, deep
nesting inside an answer) are under 2% and all labelled wrong, so a timeout can never turn a label
into a miss; the 1 MB strings are a few dozen (they cost the caller's extraction, not the workers).
The whole set grades in about 25 s with 2 workers on an idle 2-core machine.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

MEGABYTE = 1 << 20


@dataclass(frozen=True)
class Case:
    family: str
    completion: str
    gold: str
    correct: bool  # the grade the reward must give (1 if True, else 0)
    why: str = ""  # why it gets that label, where the construction does not make it plain

    def short(self, width: int = 100) -> str:
        """The completion for a failure message: its start, its end, its length."""
        text = self.completion
        shown = (
            repr(text)
            if len(text) <= width
            else f"{text[: width // 2]!r}...{text[-width // 2 :]!r} ({len(text):,} chars)"
        )
        return f"[{self.family}] gold {self.gold!r}, labelled {'correct' if self.correct else 'wrong'}: {shown}"


@dataclass(frozen=True)
class Gold:
    text: str
    equal: tuple[str, ...]  # other ways of writing the same value
    wrong: tuple[str, ...]  # near misses: prefixes, digit slips, related values

    @property
    def number(self) -> bool:
        """A plain number that the last-number rule can pick out whole."""
        return re.fullmatch(r"-?\d+", self.text) is not None


GOLDS = (
    Gold(
        "12",
        ("12", "12.0", r"\frac{24}{2}", r"\sqrt{144}", r"3 \cdot 4", "012", r"x = 12"),
        ("125", "1.2", "120", "-12", "13", "2", "1", "12.5", "112", "21", r"\frac{1}{12}", "12^{2}", "x = 125"),
    ),
    Gold(
        "72",
        ("72", r"\$72", r"72 \text{ dollars}", "70 + 2", r"8 \times 9"),
        ("7", "720", "7.2", "27", "72.5", "-72", "73", "722"),
    ),
    Gold(
        "1000",
        ("1000", "1,000", "10^{3}", "1000.0", r"1{,}000"),
        ("100", "10000", "1,001", "999", "10^{4}", "1000.5", "1,000,000"),
    ),
    Gold(
        r"\frac{1}{2}",
        ("0.5", "1/2", r"\dfrac12", r"\frac{2}{4}", "0.50", r"\tfrac{1}{2}", "2^{-1}"),
        (r"\frac{1}{3}", "0.51", "2", r"\frac{2}{1}", "0.05", "5", r"-\frac{1}{2}", r"\frac{1}{20}"),
    ),
    Gold(
        "0.25",
        (r"\frac{1}{4}", "1/4", "0.250", r"\frac{2}{8}"),
        ("0.2", "0.255", r"\frac{1}{5}", "2.5", "25", "0.025"),
    ),
    Gold(
        r"3\sqrt{2}",
        (r"\sqrt{18}", r"3\sqrt2", r"\frac{6}{\sqrt{2}}", r"\sqrt{2} \cdot 3"),
        (r"2\sqrt{3}", "4.24", r"3\sqrt{3}", r"\sqrt{2}", "3", r"\sqrt{6}", "18"),
    ),
    Gold("-5", ("-5", "-5.0", "(-5)", "- 5", r"-\frac{10}{2}"), ("5", "-50", "-0.5", "-4", r"\frac{1}{5}", "-55")),
    Gold(r"\pi", (r"\pi", r"\frac{2\pi}{2}"), (r"2\pi", r"\frac{\pi}{2}", "3", r"\pi^2", r"-\pi")),
    Gold(
        r"\frac{\sqrt{3}}{2}",
        (r"\frac{\sqrt3}{2}", r"\frac{1}{2}\sqrt{3}", r"\sqrt{3}/2"),
        (r"\frac{\sqrt{3}}{3}", r"\frac{\sqrt{2}}{2}", r"\sqrt{3}", r"\frac{3}{2}", r"\frac{\sqrt{3}}{4}"),
    ),
    Gold(
        r"(3, \frac{\pi}{2})",
        (r"\left( 3, \frac{\pi}{2} \right)", r"(3, \pi/2)"),
        (r"(3, \pi)", r"(\frac{\pi}{2}, 3)", r"(3, \frac{\pi}{3})", "3"),
    ),
    Gold("x^2 + 1", ("1 + x^2", "x^{2}+1"), ("x^2 - 1", "x^2", "x + 1", "2x + 1")),
    Gold(
        "65536",
        ("65536", "2^{16}", "2^{2^{2^{2}}}", "4^{8}"),
        ("65535", "6553", "655360", "2^{15}", "2^{2^{2^{2^{2}}}}"),
    ),
    Gold("120", ("120", "5!"), ("5", "12", "6!", "1200", "-120")),
    Gold("2432902008176640000", ("2432902008176640000", "20!"), ("19!", "21!", "243290200817664000")),
)
NUMBER_GOLDS = tuple(g for g in GOLDS if g.number)


# --- where an answer goes --------------------------------------------------------------------------


def in_answer(answer: str, before: str = "Let me work it out.") -> str:
    return f"<think>\n{before}\n</think>\n<answer>\n{answer}\n</answer>"


def in_box(answer: str, before: str = "Let me work it out.") -> str:
    return f"{before}\nSo the answer is $\\boxed{{{answer}}}$."


def in_answer_box(answer: str, before: str = "Let me work it out.") -> str:
    return f"<think>\n{before}\n</think>\n<answer>\nThe answer is $\\boxed{{{answer}}}$.\n</answer>"


def as_last_number(number: str, before: str = "Let me work it out.") -> str:
    return f"{before}\nSo the answer is {number}."


POSITIONS = (in_answer, in_box, in_answer_box)  # each makes `answer` the extracted answer; `before`
# is text ahead of it (inside <think> where there is one)


def plain_numbers(texts) -> list[str]:
    return [t for t in texts if re.fullmatch(r"-?\d+(\.\d+)?", t)]


def not_starting_with(gold: str, texts) -> list[str]:
    """The texts that do not begin with the gold. math-verify reads the leading number of an answer
    it cannot fully parse (\\foo 12^{2} reads as 12), so a wrong answer that begins with the gold's
    digits, behind junk, would be graded as the gold: a leniency of the verifier, not of extraction."""
    return [t for t in texts if not t.startswith(gold)]


def pick(rng: random.Random, options, k: int) -> list:
    return rng.sample(list(options), min(k, len(options)))


# --- families --------------------------------------------------------------------------------------


def tower(base: int, height: int) -> str:
    """base^{base^{...}} with `height` bases."""
    return "^{".join([str(base)] * height) + "}" * (height - 1)


def tower_value(base: int, height: int) -> int:
    value = base
    for _ in range(height - 1):
        value = base**value
    return value


def power_tower(rng: random.Random, slow: int = 14) -> list[Case]:
    cases = []
    exact = [(2, h) for h in (1, 2, 3, 4)] + [(3, h) for h in (2, 3)] + [(10, 2), (7, 2)]
    for base, height in exact:  # small enough to evaluate: the tower is the gold
        text, value = tower(base, height), tower_value(base, height)
        for position in POSITIONS:
            cases.append(Case("power_tower", position(text, before=tower(2, 7)), str(value), True))
        cases.append(Case("power_tower", in_answer(text), str(value + 1), False))
        if height > 1:
            cases.append(Case("power_tower", in_box(text), str(tower_value(base, height - 1)), False))
    # Towers no machine evaluates, where an answer goes; gold elsewhere or nowhere. Each costs one
    # math-verify timeout (~1 s of a worker), so only `slow` of them.
    huge = [
        tower(2, 6),
        tower(2, 7),
        tower(3, 4),
        tower(10, 3),
        tower(9, 4),
        tower(2, 40),
        "2^{1000000000}",
        "10^{10^{10^{10}}}",
        "2^{-2^{2^{2^{2^{2}}}}}",
        "(x+1)^{2000}",
        "2^2^2^2^2^2^2",
    ]
    for i in range(slow):
        text, gold = huge[i % len(huge)], rng.choice(NUMBER_GOLDS)
        where = rng.choice(POSITIONS)
        cases.append(Case("power_tower", where(text, before=f"The answer is {gold.text}."), gold.text, False))
    # Cheap ones: 2^65536 evaluates in milliseconds; unbraced towers parse (to either reading) fast.
    for gold in ("65536", "16", "7"):
        cases.append(Case("power_tower", in_answer(tower(2, 5)), gold, False))
    for gold in ("16", "7"):  # neither reading: (((2^2)^2)^2)^2 = 65536, or 2^65536
        cases.append(Case("power_tower", in_answer("2^2^2^2^2"), gold, False))
    # The tower only before the answer: never parsed, the answer decides.
    for _ in range(40):
        gold = rng.choice(GOLDS)
        noise = rng.choice([tower(2, rng.randint(6, 400)), tower(10, 50), "2^{" * 3000 + "2" + "}" * 3000])
        right = rng.random() < 0.5
        answer = rng.choice(gold.equal) if right else rng.choice(gold.wrong)
        cases.append(Case("power_tower", rng.choice(POSITIONS)(answer, noise), gold.text, right))
    # 10^{100} written out: exact big integers are fine.
    cases.append(Case("power_tower", in_answer("1" + "0" * 100), "10^{100}", True))
    cases.append(Case("power_tower", in_box("10^{100}"), "1" + "0" * 100, True))
    cases.append(Case("power_tower", in_answer("1" + "0" * 99), "10^{100}", False))
    cases.append(Case("power_tower", in_box("10^{99}"), "10^{100}", False))
    return cases


def factorial(rng: random.Random, slow: int = 10) -> list[Case]:
    cases = []
    for n in range(0, 21):
        exact = str(math.factorial(n))
        cases.append(Case("factorial", rng.choice(POSITIONS)(f"{n}!", before="10^{9}! is too big."), exact, True))
        cases.append(Case("factorial", rng.choice(POSITIONS)(f"{n}!"), str(math.factorial(n) + 1), False))
        if n > 2:
            cases.append(Case("factorial", in_answer(f"{n}!"), str(n), False))
            cases.append(Case("factorial", in_box(exact), f"{n - 1}!", False))
    cases.append(Case("factorial", in_answer("(3!)!"), "720", True))
    cases.append(Case("factorial", in_answer("720"), "(3!)!", True))
    # Evaluable but large: 100000! has 456,574 digits and takes a tenth of a second.
    for big in ("100000!", "(10^{5})!", "50000!"):
        for _ in range(3):
            gold = rng.choice(NUMBER_GOLDS)
            cases.append(Case("factorial", rng.choice(POSITIONS)(big, before=f"It is {gold.text}."), gold.text, False))
    # Not evaluable: each costs one math-verify timeout.
    huge = [
        "10^{9}!",
        "(10^{6})!",
        "1000000!",
        "10^{100}!",
        "(10^{9})!!",
        "100000!^{100000!}",
        r"\Gamma(10^{9})",
        "10^{9}! - 10^{9}!",
    ]
    for i in range(slow):
        gold = rng.choice(NUMBER_GOLDS)
        cases.append(
            Case(
                "factorial", rng.choice(POSITIONS)(huge[i % len(huge)], before=f"It is {gold.text}."), gold.text, False
            )
        )
    # Only before the answer.
    for _ in range(25):
        gold = rng.choice(GOLDS)
        right = rng.random() < 0.5
        answer = rng.choice(gold.equal) if right else rng.choice(gold.wrong)
        noise = rng.choice(huge) + " " + "!" * rng.randint(1, 5000)
        cases.append(Case("factorial", rng.choice(POSITIONS)(answer, noise), gold.text, right))
    return cases


def deep_braces(rng: random.Random, depth: int = 5000, slow: int = 10) -> list[Case]:
    cases = []
    open_, close = "{" * depth, "}" * depth
    noises = [
        open_ + "x" + close,
        open_,
        close,
        close + open_,
        r"\frac{" * depth,
        r"\left(" * depth,
        r"\sqrt{" * depth + "2" + "}" * depth,
    ]
    for noise in noises:  # nesting before the answer: the answer's own braces still match
        for _ in range(4):
            gold = rng.choice(GOLDS)
            right = rng.random() < 0.6
            answer = rng.choice(gold.equal) if right else rng.choice(gold.wrong)
            cases.append(Case("deep_braces", rng.choice(POSITIONS)(answer, noise), gold.text, right))
    for gold in GOLDS:
        e, w = rng.choice(gold.equal), rng.choice(gold.wrong)
        # 5,000 nested boxes: the last (innermost) one is the answer
        cases.append(Case("deep_braces", "\\boxed{" * depth + e + "}" * depth, gold.text, True))
        cases.append(
            Case("deep_braces", f"<think>{gold.text}</think>" + "\\boxed{" * depth + w + "}" * depth, gold.text, False)
        )
        # a box never closed is skipped; the complete one before it is the answer
        cases.append(
            Case(
                "deep_braces",
                f"\\boxed{{{e}}} but maybe \\boxed{{" + open_ + w,
                gold.text,
                True,
                "a \\boxed{ whose braces never close is skipped; the earlier complete box is the answer",
            )
        )
        cases.append(
            Case(
                "deep_braces",
                f"\\boxed{{{w}}} but maybe \\boxed{{" + open_ + e,
                gold.text,
                False,
                "the box holding the gold never closes: the earlier complete box (wrong) is the answer",
            )
        )
        # extra closing braces after a box do not change it
        cases.append(Case("deep_braces", f"\\boxed{{{e}}}" + close, gold.text, True))
        # the nesting inside the answer: longer than max_answer_chars, graded wrong unparsed
        cases.append(
            Case(
                "deep_braces",
                in_answer(open_ + e + close),
                gold.text,
                False,
                "an extracted answer longer than max_answer_chars is graded wrong without parsing",
            )
        )
        cases.append(Case("deep_braces", in_answer(open_ + e), gold.text, False, "too long and unbalanced"))
        # unbalanced braces inside the answer: not LaTeX, graded wrong unparsed
        cases.append(
            Case(
                "deep_braces",
                in_answer("{" + e),
                gold.text,
                False,
                "an extracted answer with unbalanced braces is graded wrong without parsing",
            )
        )
        cases.append(
            Case(
                "deep_braces",
                in_answer(e + "}"),
                gold.text,
                False,
                "an extracted answer with unbalanced braces is graded wrong without parsing",
            )
        )
    for gold in NUMBER_GOLDS:  # a box never closed, nothing before it: the last number decides
        cases.append(
            Case(
                "deep_braces",
                "\\boxed{" + open_ + gold.text,
                gold.text,
                True,
                "no complete \\boxed{}: the last number, here the gold, is the answer",
            )
        )
        cases.append(
            Case(
                "deep_braces",
                "\\boxed{" + open_ + gold.text + " or " + rng.choice(plain_numbers(gold.wrong)),
                gold.text,
                False,
                "no complete \\boxed{}: the last number (wrong) is the answer",
            )
        )
    # Deep nesting inside a short answer: math-verify's parse time grows fast with brace depth and
    # hits its timeout from about 12 levels. Wrong values only, so a timeout cannot flip a label.
    nests = [
        ("{", "}", 14),
        ("{", "}", 40),
        ("{", "}", 490),
        ("(", ")", 400),
        ("\\sqrt{", "}", 140),
        ("\\frac{", "}{3}", 100),
        ("\\left(", "\\right)", 70),
        ("[", "]", 450),
    ]
    for i in range(slow):
        left, right, k = nests[i % len(nests)]
        gold = rng.choice(NUMBER_GOLDS)
        cases.append(Case("deep_braces", in_answer(left * k + "7777" + right * k, before=gold.text), gold.text, False))
    return cases


def megabyte(rng: random.Random, size: int = MEGABYTE) -> list[Case]:
    cases = []

    def add(completion: str, gold: Gold, correct: bool, why: str = "") -> None:
        cases.append(Case("megabyte", completion, gold.text, correct, why))

    for _ in range(2):
        g, n = rng.choice(GOLDS), rng.choice(NUMBER_GOLDS)
        e, w = rng.choice(g.equal), rng.choice(g.wrong)
        add("9" * size, n, False, "the last number is a million digits long")
        add("9" * size + "\n" + in_answer(e), g, True)
        add("1 " * (size // 2) + f"so the answer is {n.text}.", n, True)
        add(f"{n.text} " * (size // (len(n.text) + 1)) + "no, 7777.", n, False, "the last number is 7777")
        add(
            "<answer>" * (size // 8) + e + "</answer>",
            g,
            True,
            "the last complete block is the one closed by the only </answer>",
        )
        add(
            "<answer>" + e + "</answer>" * (size // 9),
            g,
            False,
            "the block runs from the last <answer> to the last </answer>: longer than max_answer_chars",
        )
        add("</answer>" * (size // 9) + in_answer(e), g, True)
        add("\\boxed{" * (size // 7) + " " + n.text, n, True, "no complete \\boxed{}: the last number is the answer")
        add("\\boxed{1}" * (size // 9) + f"\\boxed{{{e}}}", g, True)
        add(f"\\boxed{{{e}}}" + "}" * size, g, True)
        add(f"\\boxed{{{e}}}" + "\\boxed{" * (size // 7), g, True, "the trailing \\boxed{ never close and are skipped")
        add(f"\\boxed{{{g.text}}}" * (size // (len(g.text) + 8)) + f"\\boxed{{{w}}}", g, False)
        add("\\boxed{" * (size // 14) + e + "}" * (size // 14), g, True, "the innermost box is the last one")
        add("{" * size + f"\\boxed{{{e}}}", g, True)
        add("x" * size + in_answer(e), g, True)
        add(in_answer(e, before="a" * size), g, True)
        add(in_answer(e, before=g.text + "\n" * size) + " " * size, g, True)
        add(in_answer(w, before=(g.text + " ") * (size // (len(g.text) + 1))), g, False)
        add(
            in_answer(e + " " + "x" * size),
            g,
            False,
            "an extracted answer longer than max_answer_chars is graded wrong",
        )
        add("\U0001f600" * (size // 4) + in_answer(e), g, True)
        add("\u200b" * size + in_box(e), g, True)
        add("$" * size + in_answer(e), g, True)
        add("\\" * size + in_answer(e), g, True)
        add(("<think>" + "</think>" + "<answer>") * (size // 24) + e + "</answer>", g, True)
    return cases


# invisible and visible characters that are not part of any number
CHARS = {
    "RLM": "\u200f",
    "LRM": "\u200e",
    "RLO": "\u202e",
    "PDF": "\u202c",
    "ZWJ": "\u200d",
    "ZWNJ": "\u200c",
    "ZWSP": "\u200b",
    "BOM": "\ufeff",
    "WJ": "\u2060",
    "NUL": "\x00",
    "BEL": "\x07",
    "ESC": "\x1b",
    "DEL": "\x7f",
    "emoji": "\U0001f600",
    "ZWJ emoji": "\U0001f469\u200d\U0001f4bb",
    "flag": "\U0001f1fa\U0001f1f3",
    "CJK": "\u6570",
    "Hebrew": "\u05e9",
    "Arabic": "\u0639",
    "lone surrogate": "\ud800",
    "private use": "\ue000",
    "replacement": "\ufffd",
    "noncharacter": "\uffff",
}
COMBINING = "\u0301\u0308\u0336\u0338\u20d7"  # acute, diaeresis, strike-through, long solidus, vector arrow
OTHER_DIGITS = {  # 12 in other scripts' digits
    "full-width": "\uff11\uff12",
    "Arabic-Indic": "\u0661\u0662",
    "Devanagari": "\u0967\u0968",
    "mathematical bold": "\U0001d7cf\U0001d7d0",
    "mixed": "1\u0662",
}


def unicode_noise(rng: random.Random, length: int) -> str:
    pool = list(CHARS.values()) + list(COMBINING) + ["a", " ", "\n", "7", "{", "}", "\\"]
    return "".join(rng.choice(pool) for _ in range(length))


def unicode(rng: random.Random) -> list[Case]:
    cases = []
    glued = (
        "a character glued to the front of a number makes another token (as in x12); math-verify "
        "reads characters, not glyphs, so invisible ones count too"
    )
    for _name, c in CHARS.items():
        gold = rng.choice(NUMBER_GOLDS)
        w = rng.choice(plain_numbers(gold.wrong))
        # noise around, the answer clean
        cases.append(
            Case("unicode", in_answer(gold.text, before=c * rng.randint(1, 300) + gold.text + c), gold.text, True)
        )
        cases.append(Case("unicode", in_box(rng.choice(gold.equal), before=unicode_noise(rng, 500)), gold.text, True))
        cases.append(Case("unicode", in_answer(gold.text) + c * 50, gold.text, True))
        cases.append(
            Case(
                "unicode",
                in_answer(f" {c} {gold.text}"),
                gold.text,
                True,
                "separated by whitespace the number is its own token",
            )
        )
        # trailing text after the number is ignored by math-verify, as in "72 dollars"
        cases.append(
            Case("unicode", in_answer(gold.text + c), gold.text, True, "text after the number is not part of it")
        )
        # glued before, or inside the number: not the number
        cases.append(Case("unicode", in_answer(c + gold.text), gold.text, False, glued))
        cases.append(Case("unicode", in_answer(c * 3 + gold.text + c * 3), gold.text, False, glued))
        if len(gold.text.lstrip("-")) > 1:
            cases.append(
                Case(
                    "unicode",
                    in_answer(gold.text[:-1] + c + gold.text[-1]),
                    gold.text,
                    False,
                    "a character inside a number splits it",
                )
            )
        # gold dressed up in <think>, a wrong answer dressed up in <answer>
        cases.append(Case("unicode", in_answer(c + " " + w + " " + c, before=c + gold.text + c), gold.text, False))
        cases.append(Case("unicode", in_box(w + c, before=f"{c}\\boxed{{{gold.text}}}{c}"), gold.text, False))
        # the character inside a tag breaks the tag: no answer block; the last number decides
        cases.append(
            Case(
                "unicode",
                f"First {w}. <ans{c}wer>{gold.text}</answer>",
                gold.text,
                True,
                "the broken tag leaves no answer block; the last number is the gold",
            )
        )
        cases.append(
            Case(
                "unicode",
                f"<ans{c}wer>{gold.text}</answer> and finally {w}",
                gold.text,
                False,
                "the broken tag leaves no answer block; the last number is wrong",
            )
        )
        # combining marks (strike-through, negation slash, ...) only on a wrong answer: a marked digit
        # has no agreed value, so no label on the gold would be honest
        mark, x = rng.choice(COMBINING), rng.choice(not_starting_with(gold.text, plain_numbers(gold.wrong)))
        cases.append(Case("unicode", in_answer("".join(d + mark for d in x), before=gold.text), gold.text, False))
    for name, digits in OTHER_DIGITS.items():
        why = f"{name} digits: math-verify reads ASCII numerals only, as it does not read 'twelve'"
        cases.append(Case("unicode", in_answer(digits), "12", False, why))
        cases.append(Case("unicode", in_box(digits), "12", False, why))
        cases.append(
            Case(
                "unicode", as_last_number(digits, before="I get 12? No:"), "12", False, why + "; it is the last number"
            )
        )
        cases.append(Case("unicode", in_answer("12", before=digits), "12", True))
    for _ in range(60):  # random mixtures of everything above, anywhere but the answer
        gold = rng.choice(GOLDS)
        right = rng.random() < 0.5
        answer = rng.choice(gold.equal) if right else rng.choice(gold.wrong)
        noise = unicode_noise(rng, rng.randint(1, 3000))
        cases.append(Case("unicode", rng.choice([in_answer, in_answer_box])(answer, noise), gold.text, right))
    return cases


INJECTIONS = (
    r"\input{/etc/passwd}",
    r"\include{/etc/shadow}",
    r"\input|ls",
    r"\makeatletter\@@input /etc/passwd",
    r"\write18{rm -rf /}",
    r"\immediate\write18{rm -rf ~}",
    r"\immediate\write18{touch MARKER}",
    r"\newwrite\f\immediate\openout\f=MARKER\immediate\write\f{pwned}\immediate\closeout\f",
    r"\def\x{\x}\x",
    r"\def\a{\a\a}\a",
    r"\newcommand{\x}{\x}\x",
    r"\loop\iftrue\repeat",
    r"\catcode`\{=12 \catcode`\}=12",
    r"\catcode`\^=7",
    r"\catcode`\$=14",
    r"\csname boxed\endcsname",
    r"\expandafter\def\csname boxed\endcsname#1{}",
    r"\let\boxed\relax",
    r"\renewcommand{\boxed}[1]{}",
    r"\def\boxed#1{#1#1}",
    r"\read16 to \x",
    r"\usepackage{shellesc}\ShellEscape{cat /etc/passwd}",
    r"\directlua{os.execute('rm -rf /')}",
    r"\lstinputlisting{/etc/passwd}",
    r"\verbatiminput{/etc/passwd}",
    r"\special{ps: (rm -rf /) system}",
    r"\begin{verbatim}\end{document}\end{verbatim}",
    r"\end{document}",
    r"\errmessage{boom}\batchmode",
    r"\href{javascript:alert(1)}{x}",
    r"\url{file:///etc/passwd}",
    r"\uppercase{\input{/etc/passwd}}",
    r"\string\input\jobname",
    r"\text{\input{/etc/passwd}}",
    r"\mathrm{\write18{reboot}}",
)


def injection(rng: random.Random, marker: str = "/tmp/pods-bench-tex-ran") -> list[Case]:
    cases = []
    for payload in INJECTIONS:
        payload = payload.replace("MARKER", marker)
        inside = set(re.findall(r"\d+", payload))
        golds = [g for g in GOLDS if g.text not in inside]  # no gold the payload itself spells out
        gold = rng.choice(golds)
        e, w = rng.choice(gold.equal), rng.choice(not_starting_with(gold.text, gold.wrong))
        not_run = "the reward reads LaTeX, it does not run it: a macro is not an answer"
        cases.append(Case("injection", in_answer(payload, before=gold.text), gold.text, False, not_run))
        cases.append(Case("injection", in_box(payload, before=gold.text), gold.text, False, not_run))
        cases.append(Case("injection", in_answer(payload + " " + w), gold.text, False))
        cases.append(Case("injection", in_answer(e, before=payload), gold.text, True))
        cases.append(Case("injection", in_answer(e) + "\n" + payload, gold.text, True))
        cases.append(Case("injection", in_box(e, before=payload), gold.text, True))
        cases.append(Case("injection", f"\\boxed{{{e}}}\n{payload}", gold.text, True))
        cases.append(Case("injection", in_answer_box(w, before=payload + gold.text), gold.text, False))
    for gold in GOLDS:  # macros that would change the printed answer if TeX ran them
        e, w = rng.choice(gold.equal), rng.choice(gold.wrong)
        not_run = "the reward reads LaTeX, it does not run it"
        cases.append(Case("injection", f"\\renewcommand{{\\boxed}}[1]{{{w}}}\\boxed{{{e}}}", gold.text, True, not_run))
        cases.append(Case("injection", f"\\def\\boxed#1{{{e}}}\\boxed{{{w}}}", gold.text, False, not_run))
        cases.append(Case("injection", in_answer(f"\\def\\answer{{{w}}}\\answer"), gold.text, False, not_run))
    return cases


EMPTY_TEXTS = (
    "",
    " ",
    "\n",
    "\t",
    "\r\n",
    " " * 1000,
    "\n" * 5000,
    "\u3000",
    "\u00a0",
    "\u2028",
    "\x0b\x0c",
    "<answer></answer>",
    "<answer> </answer>",
    "<answer>\n\n</answer>",
    "<answer>\u3000</answer>",
    "\\boxed{}",
    "\\boxed{ }",
    "\\boxed{\n}",
    "\\boxed{{}}",
    "\\boxed",
    "\\boxed{",
    "\\boxed}",
    "\\boxed{}}",
    "<think></think><answer></answer>",
    "<think></think>\n<answer>\n</answer>",
    "<think>\n</think>",
    "$$",
    "$ $",
    "\\(\\)",
    "\\[\\]",
    "{}",
    "<answer>$$</answer>",
    "<answer>\\boxed{}</answer>",
    "<answer>{}</answer>",
    "<answer>\\text{}</answer>",
    "<answer>\\;</answer>",
    "<answer>~</answer>",
    "<answer>\\quad</answer>",
    "<answer>.</answer>",
    "<answer>-</answer>",
    "<answer>,</answer>",
    "<answer>None</answer>",
    "<answer>null</answer>",
    "<answer>NaN</answer>",
    "<answer>undefined</answer>",
    "<answer>\x00</answer>",
    "<think>",
    "</answer>",
    "<answer>",
    "<answer></answer></answer>",
    "<answer><answer></answer>",
    "<answer>\\boxed</answer>",
)


def empty(rng: random.Random) -> list[Case]:
    cases = []
    for text in EMPTY_TEXTS:
        for gold in pick(rng, GOLDS, 2):
            cases.append(Case("empty", text, gold.text, False))
    for text in ("", "<answer></answer>", "\\boxed{}", in_answer("12"), in_answer("0")):
        cases.append(Case("empty", text, "", False, "an empty gold is graded wrong"))
    return cases


def decoy(rng: random.Random) -> list[Case]:
    cases = []

    def add(completion: str, gold: Gold, correct: bool, why: str = "") -> None:
        cases.append(Case("decoy", completion, gold.text, correct, why))

    for gold in GOLDS:
        g = gold.text
        for e in gold.equal:
            w = rng.choice(gold.wrong)
            add(in_answer(e, before=f"At first I got {w}."), gold, True)
            add(in_box(e, before=f"Not $\\boxed{{{w}}}$, I slipped."), gold, True)
        for w in gold.wrong:
            e = rng.choice(gold.equal)
            add(in_answer(w, before=f"The answer is {g}."), gold, False)  # gold in <think>, wrong in <answer>
            add(in_box(w, before=f"First $\\boxed{{{e}}}$. Hmm, no."), gold, False)  # gold in an earlier box
            add(f"<answer>{e}</answer> Wait. <answer>{w}</answer>", gold, False)  # gold in an earlier block
            add(in_answer_box(w, before=f"$\\boxed{{{g}}}$"), gold, False)
        e, w = rng.choice(gold.equal), rng.choice(gold.wrong)
        add(f"<answer>{w}</answer> Wait. <answer>{e}</answer>", gold, True)
        add(f"<answer>{e}</answer> \\boxed{{{w}}}", gold, True, "the answer block wins over any \\boxed{} outside it")
        add(f"\\boxed{{{e}}} <answer>{w}</answer>", gold, False, "the answer block wins over any \\boxed{} outside it")
        add(f"<answer>\\boxed{{{w}}} or \\boxed{{{e}}}</answer>", gold, True, "the last box in the block is the gold")
        add(f"<answer>\\boxed{{{e}}} or \\boxed{{{w}}}</answer>", gold, False, "the last box in the block is wrong")
        add(f"<answer>{e}, {w}</answer>", gold, False, "two answers are not the gold")
        add(f"<answer>{w} or {e}</answer>", gold, False, "a hedge is not the gold")
        add(f"<answer>{e} \\text{{ or }} {w}</answer>", gold, False, "a hedge is not the gold")
        add(f"<answer>{w}<answer>{e}</answer>", gold, True, "the last complete block starts at the last <answer>")
        add(f"<answer>{e}</answer><answer>{w}", gold, True, "the unclosed block is not complete: the one before it is")
        add(
            f"<answer>{w}</answer><answer>{e}", gold, False, "the unclosed block is not complete: the one before it is"
        )
        add(f"\\boxed{{{e}}} then \\boxed{{{w}", gold, True, "a \\boxed{ that never closes is skipped")
        add(f"\\boxed {{ {e} }}", gold, True)
    for gold in NUMBER_GOLDS:
        g, n = gold.text, int(gold.text)
        w = rng.choice(plain_numbers(gold.wrong))
        add(as_last_number(g, before=f"Maybe {w}."), gold, True)
        add(as_last_number(w, before=f"Maybe {g}."), gold, False)
        add(f"The answer is {g}. Check: {g} + 1 = {n + 1}", gold, False, "the last number is the check's")
        add(as_last_number(g + "5", before=f"Maybe {g}."), gold, False, "a number that has the gold only as a prefix")
        add(as_last_number("1" + g.lstrip("-"), before=f"Maybe {g}."), gold, False, "the gold only as a suffix")
        add(as_last_number(g + ".5"), gold, False)
        add(as_last_number(g + ",000"), gold, False, "a thousands separator makes it another number")
        add(
            f"<think>The answer is {g}.</think>\n<answer>\n</answer>",
            gold,
            True,
            "an empty answer block is no answer: no box either, so the last number (the gold) decides",
        )
        add(
            f"<think>The answer is {g}.</think>\n<answer>\n\\boxed{{}}\n</answer>",
            gold,
            False,
            "the answer block is '\\boxed{}', which has no value",
        )
        add(
            f"\\boxed{{{g}}} and then \\boxed{{}}",
            gold,
            True,
            "the last box is empty, so no box answer: the last number (the gold) decides",
        )
        add(
            f"\\boxed{{{w}}} and then \\boxed{{}} after {g}",
            gold,
            True,
            "the last box is empty, so no box answer: the last number (the gold) decides",
        )
        add(
            f"\\boxed{{{g}}} and then \\boxed{{}} after {w}",
            gold,
            False,
            "the last box is empty, so no box answer: the last number (wrong) decides",
        )
        add(in_box(f"{g}5"), gold, False, "a number that has the gold only as a prefix")
        add(in_answer(f"{g} 5"), gold, False, "two numbers are not the gold")
    return cases


FAMILIES = {
    "power_tower": power_tower,
    "factorial": factorial,
    "deep_braces": deep_braces,
    "megabyte": megabyte,
    "unicode": unicode,
    "injection": injection,
    "empty": empty,
    "decoy": decoy,
}


def adversarial_completions(seed: int = 0, marker: str = "/tmp/pods-bench-tex-ran") -> list[Case]:
    """All families, each from its own seeded generator (adding a family changes no other's items).
    `marker` is the file the injected TeX would write if anything ran it."""
    cases = []
    for k, (name, family) in enumerate(FAMILIES.items()):
        rng = random.Random(seed * 1000 + k)
        cases += family(rng, marker=marker) if name == "injection" else family(rng)
    return cases


if __name__ == "__main__":
    from collections import Counter

    items = adversarial_completions()
    print(len(items), dict(Counter(c.family for c in items)))
    print("labelled correct:", sum(c.correct for c in items))
