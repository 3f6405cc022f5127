"""Pretraining (PTX) text for the actor's language-modelling loss (InstructGPT's PPO-ptx).

`ppo.ptx_data` is a .jsonl or .parquet file with a `text` column. Each step draws one
text per rollout sequence, as a function of (seed, step) so that a resumed run draws the
same ones, and the controller unions them into the actor's update batch:
  ptx_input_ids, ptx_attention_mask   (N, L)   right-padded, L <= ppo.ptx_max_length
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_tokenizer
from hflow.engine.seeding import stream_seed
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.data.rows import read_table


class PtxData:
    def __init__(self, rows: list[list[int]], pad_id: int, seed: int):
        self.rows = rows
        self.pad_id = pad_id
        self.seed = seed

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> "PtxData":
        """The recipe's PTX texts, tokenized; empty (drawing nothing) when `ppo.ptx_coef` is 0."""
        p = recipe.ppo
        if p.ptx_coef <= 0 or not p.ptx_data:
            return cls([], 0, recipe.seed)

        tokenizer = load_tokenizer(recipe.model.path, recipe.model.trust_remote_code)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        rows = [(tokenizer(text)[col.INPUT_IDS] + eos)[:p.ptx_max_length] for text in read_texts(p.ptx_data)]
        rows = [r for r in rows if len(r) > 1]
        if not rows:
            raise UserError(f"ppo.ptx_data '{p.ptx_data}': no text longer than one token")
        return cls(rows, tokenizer.pad_token_id, recipe.seed)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def batch(self, step: int, size: int) -> Batch:
        """`size` texts for step `step` (an empty Batch when there is no PTX data)."""
        if not self.rows:
            return Batch()
        gen = torch.Generator().manual_seed(stream_seed(self.seed, "ptx", step))
        picked = [self.rows[i] for i in torch.randint(len(self.rows), (size,), generator=gen).tolist()]
        width = max(len(r) for r in picked)
        ids = torch.full((size, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(picked):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        return Batch({col.PTX_INPUT_IDS: ids, col.PTX_ATTENTION_MASK: mask})


def read_texts(spec: str) -> list[str]:
    rows = read_table(spec, "ppo.ptx_data", "a text column")
    if not rows or "text" not in rows[0]:
        columns = ", ".join(rows[0]) if rows else "none"
        raise UserError(f"ppo.ptx_data '{spec}': needs a `text` column; columns: {columns}")
    return [str(row["text"]) for row in rows]
