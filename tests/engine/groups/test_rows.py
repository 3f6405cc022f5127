"""A streamed step's chunks joined (`engine/groups/rows.py`) against the same rows assembled at
once: the layout every stage reads must not depend on how the rows were chunked."""

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.rows import join_rows
from hflow.engine.rollout.assembly import assemble_rollout

PAD = 0
PROMPTS = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14]]
TOKENS = torch.tensor([[21, 22, 23, 24], [25, 0, 0, 0], [26, 27, 0, 0], [28, 29, 30, 0]])
LENGTHS = torch.tensor([4, 1, 2, 3])
LOGPS = -torch.arange(1, 17, dtype=torch.float).reshape(4, 4) / 10


def _rollout(rows: slice) -> Batch:
    out = assemble_rollout(PROMPTS[rows], TOKENS[rows], LENGTHS[rows], PAD, rollout_log_probs=LOGPS[rows])
    return Batch(out, {col.UID: [f"p{i}" for i in range(4)][rows]})


def test_joined_chunks_equal_the_rows_assembled_at_once():
    whole = _rollout(slice(0, 4))
    # Chunk widths differ from the whole's: (3 prompt, 4 response) and (4, 3).
    joined = join_rows([_rollout(slice(0, 2)), _rollout(slice(2, 4))], PAD)
    assert joined.keys() == whole.keys()
    for key in whole.tensors:
        assert torch.equal(joined[key], whole[key]), key
    assert joined[col.UID] == whole[col.UID]


def test_chunks_that_did_not_pass_the_same_stages_are_refused():
    scored = _rollout(slice(0, 2)) | Batch({col.SCORES: torch.ones(2)})
    with pytest.raises(ValueError, match="chunk 1 has columns"):
        join_rows([scored, _rollout(slice(2, 4))], PAD)
