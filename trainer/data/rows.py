"""The rows of a data set: a JSONL or parquet file, or a built-in synthetic task, read and checked.

Nothing here imports torch: `hflow train`, `validate` and `eval` read and check every row they
use (`row_checks.py`) before the heavy libraries load, so a missing column or a broken line is one
error line in about a second. `prompts.py` tokenizes the rows and serves them step by step.
"""

from __future__ import annotations

import json
from pathlib import Path

from hflow.engine import columns as col
from hflow.errors import UserError
from hflow.trainer.config.sections import DataConfig
from hflow.trainer.data import tasks
from hflow.trainer.data.row_checks import check_rows
from hflow.trainer.stop import check_stop


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
