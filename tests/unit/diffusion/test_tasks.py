"""Task generation is seeded and valid; the reward rules follow algorithms.md section 2 exactly."""

from __future__ import annotations

import random

import pytest

from liveloop.diffusion import tasks
from liveloop.diffusion.tasks import countdown_reward, dataset, is_valid_solution, sudoku_reward


def test_generation_is_seeded_and_reference_answers_score_one():
    a = dataset(("sudoku", "countdown"), 40, seed=7)
    assert a == dataset(("sudoku", "countdown"), 40, seed=7)
    assert a != dataset(("sudoku", "countdown"), 40, seed=8)
    assert {p.task for p in a} == {"sudoku", "countdown"}
    for p in a:
        assert p.prompt.endswith("\n") and tasks.task_of(p.prompt) == p.task
        assert tasks.reward(p.prompt, p.answer) == 1.0, p
    with pytest.raises(ValueError, match="unknown task"):
        dataset(("chess",), 1, 0)


def test_solved_grids_are_valid():
    rng = random.Random(0)
    for _ in range(50):
        assert is_valid_solution(tasks._solved_grid(rng))
    assert not is_valid_solution([[1, 2, 3, 4]] * 4)


PROMPT = "countdown 3 5 7 = 22\n"


@pytest.mark.parametrize("response,expected", [
    ("3*5+7", 0.0),                                   # no tag
    ("<answer>3*5+7</answer>", 1.0),                  # 15 + 7 = 22
    ("<answer>7+5*3</answer>", 1.0),                  # any order of the same numbers
    ("<answer>3+5+7</answer>", 0.1),                  # right numbers, 15 != 22
    ("<answer>3*5+8</answer>", 0.1),                  # 8 is not a given number
    ("<answer>3*5</answer>", 0.1),                    # 7 unused
    ("<answer>3*5+7=22</answer>", 0.1),               # '=' is outside [0-9+-*/(). ]
    ("<answer>3**5+7</answer>", 0.1),                 # does not evaluate as plain arithmetic
    ("<answer>3/(5-5)+7</answer>", 0.1),              # wrong numbers (5 twice) anyway
    ("<answer>1+1</answer> then <answer>(3*5)+7</answer>", 1.0),  # the LAST tag counts
])
def test_countdown_reward(response, expected):
    assert countdown_reward(PROMPT, response) == expected


def test_countdown_division_within_tolerance():
    # 8 / 3 * 6 = 16.000000000000004 in floats: |value - 16| < 1e-5 -> 1.0
    assert countdown_reward("countdown 8 3 6 = 16\n", "<answer>8/3*6</answer>") == 1.0


def test_sudoku_reward_is_fraction_of_empty_cells():
    # solution 1234 3412 2143 4321; 4 empty cells: (0,0)=1, (1,1)=4, (2,2)=4, (3,3)=1
    prompt = "sudoku .234 3.12 21.3 432.\n"
    assert sudoku_reward(prompt, "<answer>1234 3412 2143 4321</answer>") == 1.0
    # wrong at (0,0) and (1,1): completion invalid -> compare with the reference: 2 of 4 right
    assert sudoku_reward(prompt, "<answer>2234 3312 2143 4321</answer>") == 0.5
    # the given cells are taken from the puzzle, whatever the answer says there: only blanks count
    assert sudoku_reward(prompt, "<answer>1111 1411 1141 1111</answer>") == 1.0
    # digits "1","2" fill cells 0 and 1; cell 0 (blank, solution 1) is right; the other blanks are missing
    assert sudoku_reward(prompt, "<answer>12</answer>") == 0.25
    assert sudoku_reward(prompt, "1234 3412 2143 4321") == 0.0  # no tag
    assert tasks.reward("hello there", "<answer>1</answer>") is None
