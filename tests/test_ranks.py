"""tests/ranks.py, which starts the multi-rank tests' processes: a rank that dies on a signal fails
the test with the Python stack of the moment, and ranks that finish leave with every file written."""

import os
from pathlib import Path

import pytest


def _write_then_maybe_abort(rank: int, world_size: int, out_dir: str, abort_rank: int) -> None:
    (Path(out_dir) / f"done-{rank}-of-{world_size}").write_text("yes")
    if rank == abort_rank:
        _abort_here()


def _abort_here() -> None:
    os.abort()


def test_a_rank_killed_by_a_signal_fails_with_its_stack(tmp_path):
    import ranks

    with pytest.raises(AssertionError) as died:
        ranks.spawn(_write_then_maybe_abort, 2, tmp_path, str(tmp_path), 1)
    message = str(died.value)
    assert message.startswith("rank 1 died (SIGABRT)")
    assert "Fatal Python error: Aborted" in message and "_abort_here" in message  # faulthandler's stack


def test_ranks_that_finish_leave_cleanly_with_their_files(tmp_path):
    import ranks

    ranks.spawn(_write_then_maybe_abort, 2, tmp_path, str(tmp_path), -1)
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0-of-2", "done-1-of-2"]
    assert all((tmp_path / f"rank-{r}.stderr").read_text() == "" for r in range(2))
