"""The two verifiable tasks of the BGPO paper at toy scale, generated locally and seeded: 4x4 Sudoku and
Countdown with 3 numbers. Owns the prompt/answer text formats and the published reward rules.

Formats (one prompt line, the response is an `<answer>` tag):
    sudoku 12.4 ..3. .1.. 4..1\\n          ->  <answer>1234 3412 2143 4321</answer>
    countdown 3 5 7 = 22\\n                ->  <answer>3*5+7</answer>
Rewards (docs/design.md, "BGPO"): the LAST <answer>...</answer> counts.
Countdown: no tag 0; numbers not exactly the given ones, characters outside [0-9+-*/(). ] or an expression
that does not evaluate 0.1; |value - target| < 1e-5 1.0, else 0.1.
Sudoku: the fraction of the puzzle's empty cells filled correctly (no tag 0).
Knows nothing about tokens or models.
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
COUNTDOWN_CHARS = re.compile(r"^[0-9+\-*/(). ]*$")
TASKS = ("sudoku", "countdown")


@dataclass(frozen=True)
class Problem:
    task: str  # "sudoku" | "countdown"
    prompt: str  # the prompt text, ending in a newline
    answer: str  # a reference response (a correct one), e.g. "<answer>3*5+7</answer>"


def last_answer(text: str) -> str | None:
    found = ANSWER_RE.findall(text)
    return found[-1] if found else None


# -- Sudoku 4x4 ------------------------------------------------------------------------------------------

_BASE = ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1))


def _solved_grid(rng: random.Random) -> list[list[int]]:
    """A uniformly shuffled valid grid: relabel digits, swap rows within bands, bands, columns within
    stacks, stacks, and maybe transpose (all validity-preserving)."""
    digits = [1, 2, 3, 4]
    rng.shuffle(digits)
    grid = [[digits[v - 1] for v in row] for row in _BASE]
    bands = [0, 1]
    rng.shuffle(bands)
    rows = [b * 2 + r for b in bands for r in rng.sample([0, 1], 2)]
    stacks = [0, 1]
    rng.shuffle(stacks)
    cols = [s * 2 + c for s in stacks for c in rng.sample([0, 1], 2)]
    grid = [[grid[r][c] for c in cols] for r in rows]
    if rng.random() < 0.5:
        grid = [list(col) for col in zip(*grid)]
    return grid


def is_valid_solution(grid: list[list[int]]) -> bool:
    groups = [row for row in grid] + [list(col) for col in zip(*grid)]
    groups += [[grid[r + i][c + j] for i in (0, 1) for j in (0, 1)] for r in (0, 2) for c in (0, 2)]
    return all(sorted(g) == [1, 2, 3, 4] for g in groups)


def _grid_text(cells: list[int | None]) -> str:
    s = "".join("." if v is None else str(v) for v in cells)
    return " ".join(s[i : i + 4] for i in range(0, 16, 4))


def sudoku_problem(rng: random.Random, min_empty: int = 4, max_empty: int = 8) -> Problem:
    grid = _solved_grid(rng)
    flat: list[int | None] = [v for row in grid for v in row]
    solution = _grid_text(flat)
    for i in rng.sample(range(16), rng.randint(min_empty, max_empty)):
        flat[i] = None
    return Problem("sudoku", f"sudoku {_grid_text(flat)}\n", f"<answer>{solution}</answer>")


def sudoku_reward(prompt: str, response: str) -> float:
    """Fraction of the puzzle's empty cells that the answer fills with the solution's digit.

    The answer's digits are read in order (separators ignored); a missing digit counts as wrong.
    4x4 puzzles with few blanks can have several solutions: a cell counts as correct when the answer's
    whole grid is a valid completion of the puzzle, else when it matches the reference solution."""
    answer = last_answer(response)
    puzzle = _puzzle_cells(prompt)
    if answer is None or puzzle is None:
        return 0.0
    empty = [i for i, v in enumerate(puzzle) if v is None]
    if not empty:
        return 1.0
    digits = [int(ch) for ch in answer if ch in "1234"][:16]
    digits += [0] * (16 - len(digits))
    completed = [puzzle[i] if puzzle[i] is not None else digits[i] for i in range(16)]
    grid = [completed[r * 4 : r * 4 + 4] for r in range(4)]
    if is_valid_solution(grid):
        return 1.0
    reference = _solve(puzzle)
    return sum(digits[i] == reference[i] for i in empty) / len(empty)


def _puzzle_cells(prompt: str) -> list[int | None] | None:
    m = re.search(r"sudoku ([1-4.]{4}) ([1-4.]{4}) ([1-4.]{4}) ([1-4.]{4})", prompt)
    if m is None:
        return None
    return [None if ch == "." else int(ch) for ch in "".join(m.groups())]


def _solve(puzzle: list[int | None]) -> list[int]:
    """The first completion found by backtracking (the reference the partial score compares against)."""
    cells = list(puzzle)

    def ok(i: int, v: int) -> bool:
        r, c = divmod(i, 4)
        box = [(r // 2 * 2 + a) * 4 + c // 2 * 2 + b for a in (0, 1) for b in (0, 1)]
        peers = [r * 4 + k for k in range(4)] + [k * 4 + c for k in range(4)] + box
        return all(cells[p] != v for p in peers if p != i)

    def fill(i: int) -> bool:
        if i == 16:
            return True
        if cells[i] is not None:
            return fill(i + 1)
        for v in (1, 2, 3, 4):
            if ok(i, v):
                cells[i] = v
                if fill(i + 1):
                    return True
        cells[i] = None
        return False

    if not fill(0):
        raise ValueError("unsolvable puzzle")
    return [int(v) for v in cells]  # type: ignore[arg-type]


# -- Countdown (3 numbers) -------------------------------------------------------------------------------

def countdown_problem(rng: random.Random, low: int = 1, high: int = 9) -> Problem:
    """Three numbers and a target reachable by +, -, * over all three (each used once)."""
    while True:
        nums = [rng.randint(low, high) for _ in range(3)]
        a, b, c = rng.sample(nums, 3)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        expr = f"({a}{op1}{b}){op2}{c}" if rng.random() < 0.3 else f"{a}{op1}{b}{op2}{c}"
        target = _evaluate(expr)
        if target is not None and target > 0 and target == int(target):
            return Problem("countdown", f"countdown {nums[0]} {nums[1]} {nums[2]} = {int(target)}\n",
                           f"<answer>{expr}</answer>")


def countdown_reward(prompt: str, response: str) -> float:
    m = re.search(r"countdown (\d+) (\d+) (\d+) = (\d+)", prompt)
    answer = last_answer(response)
    if m is None or answer is None:
        return 0.0
    numbers, target = sorted(int(x) for x in m.groups()[:3]), int(m.group(4))
    if not COUNTDOWN_CHARS.match(answer) or sorted(int(x) for x in re.findall(r"\d+", answer)) != numbers:
        return 0.1
    value = _evaluate(answer)
    if value is None:
        return 0.1
    return 1.0 if abs(value - target) < 1e-5 else 0.1


_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


def _evaluate(expr: str) -> float | None:
    """+, -, *, / and parentheses over integer literals (no `**`, `//`: they do not evaluate)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        return float(_eval_node(tree.body))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_node(node.left), _eval_node(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("not an arithmetic expression")


# -- Datasets ----------------------------------------------------------------------------------------------

def make_problem(task: str, rng: random.Random) -> Problem:
    if task == "sudoku":
        return sudoku_problem(rng)
    if task == "countdown":
        return countdown_problem(rng)
    raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")


def problems(tasks: tuple[str, ...], seed: int) -> Iterator[Problem]:
    """An endless seeded stream of problems, the tasks interleaved in turn."""
    for t in tasks:
        if t not in TASKS:
            raise ValueError(f"unknown task {t!r} (known: {', '.join(TASKS)})")
    rng = random.Random(seed)
    i = 0
    while True:
        yield make_problem(tasks[i % len(tasks)], rng)
        i += 1


def dataset(tasks: tuple[str, ...], n: int, seed: int) -> list[Problem]:
    stream = problems(tasks, seed)
    return [next(stream) for _ in range(n)]


def task_of(prompt: str) -> str | None:
    """Which task a prompt belongs to (None: not a task prompt, e.g. a user's free-form chat)."""
    if _puzzle_cells(prompt) is not None:
        return "sudoku"
    if re.search(r"countdown (\d+) (\d+) (\d+) = (\d+)", prompt):
        return "countdown"
    return None


def reward(prompt: str, response: str) -> float | None:
    """The task reward of `response`, or None when the prompt is not a task prompt."""
    task = task_of(prompt)
    if task == "sudoku":
        return sudoku_reward(prompt, response)
    if task == "countdown":
        return countdown_reward(prompt, response)
    return None
