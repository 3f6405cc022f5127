"""DAPO's overlong penalty (eq. 13) and dynamic sampling filter, against hand-computed values."""

import pytest
import torch

from hflow.engine.rlmath.dapo import overlong_penalty, varied_groups


def test_overlong_penalty_ramps_over_the_buffer():
    # max 10, buffer 4: free up to 6 tokens, then -(len - 6)/4 * 0.5, -0.5 at 10 and beyond.
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    got = overlong_penalty(lengths, max_length=10, buffer=4, penalty=0.5)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.125, -0.25, -0.5, -0.5])


def test_overlong_penalty_off_and_bad_buffer():
    assert overlong_penalty(torch.tensor([10, 10]), 10, 0).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 10, 10)


def test_varied_groups_drops_groups_whose_scores_are_all_equal():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0])
    ids = [7, 8, 7, 9, 8, 9, 7]
    kept, dropped = varied_groups(scores, ids)
    assert kept == [[0, 2, 6], [3, 5]]  # group 7: 1, 1, 0; group 9: 0.5, 1
    assert dropped == [[1, 4]]          # group 8: 0, 0
