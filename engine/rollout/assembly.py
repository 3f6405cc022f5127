"""The rollout dict every generation engine returns, built in one place.

Rows are grouped by prompt (prompt 0's n samples, then prompt 1's, ...). Shapes (N rows,
P = longest prompt, R = longest response, at least 1):
  input_ids, attention_mask, position_ids   (N, P + R)  prompt left-padded, response right-padded
  responses, response_mask                  (N, R)      padding is `pad_token_id` / 0
  any per-token float column given          (N, R)      zero where response_mask is 0

A multi-turn episode's response holds the sampled turns and the environment's observation
tokens between them (`episodes.py`): the attention mask covers all of them, `response_mask`
only the sampled ones (the tokens trained on), so it may have gaps. Single-turn: no gaps.
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.padding import left_padded, positions


def assemble_rollout(prompts: list[list[int]], responses: torch.Tensor, lengths: torch.Tensor,
                     pad_token_id: int, trained: torch.Tensor | None = None,
                     **per_token: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rollout dict for N rows.

    prompts: N prompt token lists (one per row, already repeated per sample);
    responses: (N, >= R) sampled token ids, the first `lengths[i]` of row i valid;
    lengths: (N,) response lengths; trained: (N, >= R) 1 on the tokens to train on (default:
    every response token); per_token: name -> (N, >= R) float tensors such as
    `rollout_log_probs`, cut to R columns and zeroed where `response_mask` is 0.
    """
    width_r = max(1, int(lengths.max())) if len(lengths) else 1
    real = (torch.arange(width_r)[None] < lengths[:, None]).long()
    response_mask = real if trained is None else _fit(trained.long(), width_r, 0) * real
    responses = _fit(responses.long(), width_r, pad_token_id).masked_fill(real == 0, pad_token_id)
    prompt_ids, prompt_mask = left_padded(prompts, pad_token_id)
    attention_mask = torch.cat([prompt_mask, real], dim=1)
    out = {
        col.INPUT_IDS: torch.cat([prompt_ids, responses], dim=1),
        col.ATTENTION_MASK: attention_mask,
        col.POSITION_IDS: positions(attention_mask),
        col.RESPONSES: responses,
        col.RESPONSE_MASK: response_mask,
    }
    for name, values in per_token.items():
        out[name] = _fit(values.float(), width_r, 0.0) * response_mask
    return out


def _fit(t: torch.Tensor, width: int, fill: float | int) -> torch.Tensor:
    """`t` cut or right-padded to `width` columns."""
    if t.shape[1] >= width:
        return t[:, :width].clone()
    return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)
