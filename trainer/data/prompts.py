"""Prompt data: the rows of a data set (read and checked by `rows.py`), tokenized once.

The order is a pure function of (seed, step): epoch e is a seeded permutation of the
rows, and step k takes the next `prompts_per_step` rows of the endless sequence of
epochs. A resumed run therefore sees exactly the prompts of an uninterrupted one.

A prompt keeps its last `data.max_prompt_length` tokens. A text longer than can hold them
(`prompt_char_limit`) is first cut to its last characters, before it is tokenized: a 10 MB
line would otherwise be tokenized whole (gigabytes, tens of seconds, deaf to SIGTERM inside the
tokenizer) to keep a few hundred tokens. The row keeps the cut text, which is what the reward
function and samples.jsonl see. The loading loops stop at a stop signal (`stop.check_stop`).
"""

from __future__ import annotations

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.seeding import stream_seed
from hflow.errors import UserError
from hflow.trainer.config.sections import DataConfig
from hflow.trainer.data.rows import read_rows
from hflow.trainer.stop import check_stop


def prompt_char_limit(tokenizer, max_length: int) -> int:
    """The characters of a text that hold its last `max_length` tokens. No token spans more
    characters than its vocabulary entry has (byte-level BPE: one per byte; SentencePiece: one
    per character), so they lie within the last max_length x the longest entry, plus one entry
    for the token the cut splits."""
    longest = max((len(token) for token in tokenizer.get_vocab()), default=1)
    return (max_length + 1) * max(1, longest)


def cut_prompt(prompt, limit: int):
    """A text prompt's last `limit` characters; of chat messages, each content's last `limit`
    (the conversation's last tokens come from the ends of its messages)."""
    if isinstance(prompt, list):
        return [{**m, "content": m["content"][-limit:]}
                if isinstance(m, dict) and isinstance(m.get("content"), str) and len(m["content"]) > limit else m
                for m in prompt]
    return prompt[-limit:] if isinstance(prompt, str) and len(prompt) > limit else prompt


def encode_prompt(tokenizer, prompt, max_length: int, limit: int | None = None) -> list[int]:
    """Token ids of a text prompt or of chat messages (through the chat template), cut from the
    left; a long text is cut to `limit` characters first (`prompt_char_limit` when None)."""
    prompt = cut_prompt(prompt, limit or prompt_char_limit(tokenizer, max_length))
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, col.INPUT_IDS):
            ids = ids[col.INPUT_IDS]
    else:
        ids = tokenizer(str(prompt), add_special_tokens=False)[col.INPUT_IDS]
    return list(ids)[-max_length:]


def encode_rows(rows: list[dict], tokenizer, max_length: int) -> None:
    """Each row's `prompt_ids`; a long prompt is cut first, in the row too (see the module docstring)."""
    limit = prompt_char_limit(tokenizer, max_length)
    for row in rows:
        check_stop()
        row[col.PROMPT] = cut_prompt(row[col.PROMPT], limit)
        row[col.PROMPT_IDS] = encode_prompt(tokenizer, row[col.PROMPT], max_length, limit)


class PromptData:
    def __init__(self, cfg: DataConfig, tokenizer, seed: int, prompts_per_step: int):
        self.seed = seed
        self.shuffle = cfg.shuffle
        self.per_step = prompts_per_step
        self.rows = read_rows(cfg, seed)
        encode_rows(self.rows, tokenizer, cfg.max_prompt_length)
        self.rows = [row for row in self.rows if row[col.PROMPT_IDS]]
        if not self.rows:
            raise UserError(f"data.train '{cfg.train}': every prompt is empty after tokenization")
        self.columns = list(self.rows[0])
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            if self.shuffle:
                gen = torch.Generator().manual_seed(stream_seed(self.seed, "data", epoch))
                self._orders = {epoch: torch.randperm(len(self.rows), generator=gen).tolist()}
            else:
                self._orders = {epoch: list(range(len(self.rows)))}
        return self._orders[epoch]

    def batch(self, step: int) -> Batch:
        """The prompts of step `step` (1-based), with a `uid` per prompt for grouping."""
        return self.batch_at((step - 1) * self.per_step, step)

    def batch_at(self, start: int, step: int) -> Batch:
        """`prompts_per_step` prompts from position `start` of the (epoch-shuffled) stream on, for
        step `step`; a prompt's `uid` is its position. DAPO's dynamic sampling reads on past a
        step's own prompts with it (`trainer/algorithms/dapo.py`)."""
        picked = []
        for position in range(start, start + self.per_step):
            epoch, offset = divmod(position, len(self.rows))
            picked.append((position, self._order(epoch)[offset]))
        columns = {key: [self.rows[i].get(key) for _, i in picked] for key in self.columns}
        columns[col.UID] = [position for position, _ in picked]
        return Batch(columns=columns, meta={"step": step})
