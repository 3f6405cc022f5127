"""A reward function's return is checked once, in the reward worker: one line naming the recipe
key and the function for anything but one real number per response, and for an exception."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hflow.engine.workers.function_scores import call_scorer, checked_scores
from hflow.errors import UserError

WHAT = "reward.function 'mod:fn'"
EXPECTED = "; expected a list of 3 floats, one per response"


@pytest.mark.parametrize("value, returned", [
    (None, "None"),
    (0.5, "a float (0.5)"),
    (1, "an int (1)"),
    ("0.5", "a str ('0.5')"),
    ({"a": 1.0}, "a dict ({'a': 1.0})"),
    ([1.0, 2.0], "2 scores for 3 responses"),
    ([[1.0], [2.0], [3.0]], "a list whose element 0 is a list ([1.0])"),
    ([1.0, "2", 3.0], "a list whose element 1 is a str ('2')"),
    ([1.0, None, 3.0], "a list whose element 1 is None"),
    ([1.0, 2j, 3.0], "a list whose element 1 is a complex (2j)"),
    (torch.ones(3, 1), "a Tensor of shape (3, 1)"),
    (np.ones((3, 1)), "a ndarray of shape (3, 1)"),
    (torch.tensor(1.0), "a Tensor of shape ()"),
])
def test_a_bad_return_is_one_line_naming_the_function(value, returned):
    with pytest.raises(UserError) as err:
        checked_scores(value, 3, WHAT)
    assert str(err.value) == f"{WHAT} returned {returned}{EXPECTED}"


@pytest.mark.parametrize("value", [
    [1.0, 0, True], (0.5, 1, 2), [np.float32(1.5), np.int64(2), np.bool_(True)],
    [torch.tensor(1.5), torch.tensor(2), torch.tensor(3.0)], np.array([1.5, 2, 3]), torch.tensor([1.5, 2.0, 3.0]),
])
def test_real_numbers_of_any_kind_are_scores(value):
    assert checked_scores(value, 3, WHAT).tolist() == pytest.approx([float(v) for v in value])


def test_nan_and_inf_are_numbers_here_the_controller_decides():
    scores = checked_scores([float("nan"), float("inf"), 1.0], 3, WHAT)
    assert scores.dtype == torch.float32 and torch.isnan(scores[0]) and torch.isinf(scores[1])


def test_a_raising_function_is_one_line_with_the_exception():
    def fn(prompts, responses, **columns):
        raise ValueError("the reward service is down\nsecond line")

    with pytest.raises(UserError) as err:
        call_scorer(fn, WHAT, ["p"], ["r"], {})
    assert str(err.value) == f"{WHAT} raised ValueError: the reward service is down"
    assert isinstance(err.value.__cause__, ValueError)  # the traceback train.log keeps
