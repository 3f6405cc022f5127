"""Prompt data: JSONL / parquet files or built-in synthetic tasks, tokenized once.

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

import json
from pathlib import Path

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.seeding import stream_seed
from hflow.errors import UserError
from hflow.trainer.config.sections import DataConfig
from hflow.trainer.stop import check_stop
from hflow.trainer.data import tasks
from hflow.trainer.data.row_checks import check_rows


def read_rows(cfg: DataConfig, seed: int, functions: dict[str, str] | None = None) -> list[dict]:
    """The raw rows of `data.train`, each with the prompt under the key `prompt`, every row
    checked (`row_checks.check_rows`; `functions`: the scoring functions whose columns to check,
    by recipe key, e.g. {"reward.function": "synthetic"})."""
    spec = cfg.train
    if spec.startswith("synthetic:"):
        task = synthetic_task(spec, "data.train")
        if task in tasks.EVAL_ONLY:
            raise UserError(f"data.train {spec!r}: a held-out variant for evaluation only; train on "
                            f"synthetic:{task.split('_')[0]} and evaluate on {spec} (eval.sets)")
        return tasks.make_rows(task, cfg.synthetic_size, seed)
    rows = read_table(spec, "data.train", "a prompt column")
    if not rows:
        raise UserError(f"data.train '{spec}': the data set is empty")
    check_rows(rows, f"data.train '{spec}'", cfg.prompt_key, functions or {})
    for row in rows:
        row[col.PROMPT] = row.pop(cfg.prompt_key)
    return rows


def synthetic_task(spec: str, key: str) -> str:
    """The task of `synthetic:TASK`; an unknown one is a user error naming `key`."""
    task = spec.split(":", 1)[1]
    if task not in tasks.TASKS:
        raise UserError(f"{key} {spec!r}: unknown synthetic task; accepted: "
                        + ", ".join(f"synthetic:{t}" for t in tasks.TASKS))
    return task


SYNTHETIC_EVAL_SIZE = 128  # held-out problems a `synthetic:` eval draws when data.eval_size is unset


def read_eval_rows(cfg: DataConfig, reward_function: str | None, seed: int) -> list[dict]:
    """The rows of `data.eval`, each with its prompt under `prompt`, checked for the columns the
    reward function reads (so that a bad eval file stops the run before it starts, not mid-run)."""
    spec = cfg.eval
    if spec.startswith("synthetic:"):
        task = synthetic_task(spec, "data.eval")
        return tasks.make_rows(task, cfg.eval_size or SYNTHETIC_EVAL_SIZE, seed, split="eval")
    rows = read_table(spec, "data.eval", "a prompt column")[:cfg.eval_size]
    if not rows:
        raise UserError(f"data.eval '{spec}': the data set is empty")
    check_rows(rows, f"data.eval '{spec}'", cfg.prompt_key,
               {"reward.function": reward_function} if reward_function else {})
    for row in rows:
        row[col.PROMPT] = row.pop(cfg.prompt_key)
    return rows


def read_table(spec: str, key: str, needs: str) -> list[dict]:
    """The rows of a .jsonl or .parquet file; `key` and `needs` name the recipe key in errors."""
    path = Path(spec)
    if not path.is_file():
        where = "" if path.is_absolute() else f", looked for {path.absolute()}"
        raise UserError(f"{key}: file '{spec}' does not exist{where} (give a .jsonl or .parquet file with {needs}"
                        + (", or synthetic:TASK)" if key == "data.train" else ")"))
    if path.suffix == ".jsonl":
        return _read_jsonl(path)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as err:
            raise UserError(f"{key} '{spec}': not a readable parquet file ({str(err).splitlines()[0]})") from None
    raise UserError(f"{key} '{spec}': unsupported file type {path.suffix!r}; accepted: .jsonl, .parquet")


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not a UTF-8 text file of JSON lines ({err.reason} at byte {err.start})") from None
    for number, line in enumerate(text.splitlines(), 1):
        check_stop()
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{number}: each line must be a JSON object")
        rows.append(row)
    return rows


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
