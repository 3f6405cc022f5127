"""The padded layout of a step's tensors (`columns.py`): prompts padded on the left, responses on
the right, position ids counted from the attention mask. The engine's ground floor: generation,
scoring, training and the worker groups all lay rows out this way."""

from __future__ import annotations

import torch

from hflow.engine import columns as col

SEQUENCE_KEYS = (col.INPUT_IDS, col.ATTENTION_MASK, col.POSITION_IDS)
"""The columns that span prompt and response: padded on both sides."""


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded attention mask (padding gets position 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) (len(rows), longest) of ragged token rows, each left-padded with `pad` to the
    longest (mask 1 on real tokens): prompts as a rollout lays them out."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, r in enumerate(rows):
        ids[row, width - len(r):] = torch.as_tensor(r, dtype=torch.long)
        mask[row, width - len(r):] = 1
    return ids, mask


def pad_rows(rows: list[list], fill: float | int, dtype: torch.dtype) -> torch.Tensor:
    """Ragged rows right-padded with `fill` into one (len(rows), max(1, longest)) tensor."""
    width = max([1, *map(len, rows)])
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for row, values in enumerate(rows):
        if values:
            out[row, :len(values)] = torch.as_tensor(values, dtype=dtype)
    return out


def pad_rollout(out: dict[str, torch.Tensor], prompt_width: int, response_width: int,
                pad_token_id: int) -> dict[str, torch.Tensor]:
    """A generator's output widened to `prompt_width + response_width` columns: prompts padded
    on the left, responses on the right (so data-parallel ranks can agree on one shape)."""
    width_r = out[col.RESPONSE_MASK].shape[1]
    width_p = out[col.ATTENTION_MASK].shape[1] - width_r
    left, right = prompt_width - width_p, response_width - width_r
    if left == 0 and right == 0:
        return out
    fill = {col.INPUT_IDS: pad_token_id, col.RESPONSES: pad_token_id}
    padded = {}
    for key, t in out.items():
        value = fill.get(key, 0)
        if key in SEQUENCE_KEYS:
            padded[key] = torch.nn.functional.pad(t, (left, right), value=value)
        elif t.dim() >= 2 and t.shape[1] == width_r:
            padded[key] = torch.nn.functional.pad(t, (0, right), value=value)
        else:
            padded[key] = t
    return padded
