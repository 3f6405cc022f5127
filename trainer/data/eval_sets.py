"""The rows of one held-out set of `eval.sets`: a built-in task's held-out problems or a file's rows,
each prompt built by the set's template when it has one, every row checked before the run starts.

A template is a Python format string over the row's columns, restricted to plain `{column}` fields:
no attribute or index lookups, no conversions or format specs (a recipe is not trusted to reach
into Python objects through a format string).
"""

from __future__ import annotations

import string

from hflow.engine import columns as col
from hflow.errors import UserError
from hflow.trainer.config.eval_section import EvalSet
from hflow.trainer.data import tasks
from hflow.trainer.data.rows import SYNTHETIC_EVAL_SIZE, read_table, synthetic_task
from hflow.trainer.data.row_checks import check_rows


def template_fields(template: str, where: str) -> list[str]:
    """The columns `template` reads; anything but plain {column} fields is a user error."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise UserError(f"{where}: not a format string ({err}); write columns as {{column}} and braces as {{{{ }}}}")
    fields = []
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            raise UserError(f"{where}: field {{{field}{'!' + conversion if conversion else ''}"
                            f"{':' + spec if spec else ''}}} is not a plain {{column}} (letters, digits, _)")
        fields.append(field)
    return fields


def read_set_rows(held_out: EvalSet, reward_function: str | None, seed: int) -> list[dict]:
    """The set's rows, each with its prompt under `prompt` and the columns its scoring reads."""
    where = f"eval.sets '{held_out.name}'"
    if held_out.data.startswith("synthetic:"):
        task = synthetic_task(held_out.data, f"{where} data")
        rows = tasks.make_rows(task, held_out.size or SYNTHETIC_EVAL_SIZE, seed, split="eval")
        prompt_key = col.PROMPT
    else:
        rows = read_table(held_out.data, f"{where} data", "a prompt column")[:held_out.size]
        if not rows:
            raise UserError(f"{where} data '{held_out.data}': the data set is empty")
        prompt_key = held_out.prompt_key
    if held_out.template is not None:
        _apply_template(rows, held_out, f"{where} template")
        prompt_key = col.PROMPT
    functions = {"reward.function": reward_function} if reward_function and held_out.extract == "reward" else {}
    check_rows(rows, f"{where} data '{held_out.data}'", prompt_key, functions)
    for number, row in enumerate(rows, 1):
        if held_out.extract != "reward" and row.get(held_out.answer_key) is None:
            raise UserError(f"{where} data '{held_out.data}': row {number} has no {held_out.answer_key!r} "
                            f"(eval.sets answer_key), which extract {held_out.extract!r} compares with; "
                            f"columns: {', '.join(row)}")
        row[col.PROMPT] = row.pop(prompt_key)
    return rows


def _apply_template(rows: list[dict], held_out: EvalSet, where: str) -> None:
    fields = template_fields(held_out.template, where)
    for number, row in enumerate(rows, 1):
        missing = [f for f in fields if f not in row]
        if missing:
            raise UserError(f"{where}: row {number} of '{held_out.data}' has no column {missing[0]!r}; "
                            f"columns: {', '.join(row)}")
        text = held_out.template.format(**{f: row[f] for f in fields})
        row[col.PROMPT] = [{"role": "user", "content": text}] if held_out.chat else text
