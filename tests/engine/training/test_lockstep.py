"""ZeRO-3 ranks run the same forwards whatever rows they hold (engine/training/lockstep.py).

Two gloo ranks on the CPU under a real DeepSpeed ZeRO-3 engine (tests/lockstep_ranks.py): one
rank's rows would have it share prompts (two forwards a micro-batch) and the other's not (one),
or the ranks hold different numbers of micro-batches. Each forward all-gathers parameter shards,
so before the fix a rank waited for a forward the other never ran: in the update scenario until
the process group's timeout (20 s here, not the default 30 min: "Timed out waiting 20000ms"), in
the scoring one until the other rank, gone on to its next collective, failed on the mismatch.
Now both ranks complete, each with the log-probs it gets scoring its rows alone, without ZeRO."""

import json

import pytest
import torch

from hflow.engine.training.packing import micro_batches, prompt_group_cut

TIMEOUT_S = 20.0  # the process group's: a rank waiting on a collective this long fails


@pytest.mark.slow
def test_zero3_ranks_run_the_same_forwards_on_different_rows(tiny_model, tmp_path):
    """Both scenarios of tests/lockstep_ranks.py, one after the other in the same two ranks."""
    import lockstep_ranks
    from hflow.engine.groups.dist import free_port
    from ranks import spawn

    spawn(lockstep_ranks.run, 2, tmp_path, free_port(), str(tiny_model), str(tmp_path), TIMEOUT_S)
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]

    # batched_log_probs: rank 0 [A A B B] in 2 micro-batches, rank 1 [C C D E F F] in 3. Both would
    # share prompts, so both do for all 3 (rank 0's third a dummy), [D E] included: 2 passes each.
    assert ranks[0]["scoring"]["forwards"] == ranks[1]["scoring"]["forwards"] == 6
    # micro_batches + response_log_probs with backward and a step: rank 0's rows [A A B B] would
    # share prompts, rank 1's [C D E G] have none to share: both score whole rows, 2 x 1 pass.
    assert ranks[0]["update"]["shared"] == ranks[1]["update"]["shared"] == [False, False]
    assert ranks[0]["update"]["forwards"] == ranks[1]["update"]["forwards"] == 2
    for rank in range(2):
        for scenario in ("scoring", "update"):
            result = torch.load(tmp_path / f"{scenario}-{rank}.pt")
            for got, want in zip(result["got"], result["want"], strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_prompt_group_is_split_when_the_ranks_need_more_micro_batches():
    """A rank whose rows are one prompt's samples still makes as many micro-batches as another
    rank asks for (each part runs the prompt itself)."""
    groups = torch.tensor([0, 0, 0, 0])
    rows = prompt_group_cut(torch.full((4,), 10), torch.tensor([2, 3, 2, 1]), groups, max_tokens=10_000,
                            min_groups=3)
    assert len(rows) == 3 and sorted(r for part in rows for r in part) == [0, 1, 2, 3]


def test_without_other_ranks_zero3_changes_nothing():
    """World size 1: `zero3` neither reduces anything nor marks the micro-batches."""
    import lockstep_ranks

    b = lockstep_ranks.rows_batch("AABB", 50)
    plain = micro_batches(b, 2, None, 1, "cpu", share_prompts=True)
    flagged = micro_batches(b, 2, None, 1, "cpu", share_prompts=True, zero3=True)
    assert [m.meta for m in plain] == [m.meta for m in flagged]
    assert all(m.meta["share_prompts"] and not m.meta["lockstep"] for m in plain)
