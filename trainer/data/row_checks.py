"""One pass over every row of a prompt file, before a run starts.

Without it a bad row surfaces mid-run (row 8 without a prompt: a KeyError at the step that
draws it), or never (a null prompt trained on as the text "None"). Each problem is one line
naming the file, the 1-based row and what would be accepted.
"""

from __future__ import annotations

from hflow.errors import UserError
from hflow.trainer.data.rewards import COLUMNS_READ

PROMPT_FORMS = 'a non-empty string or a list of chat messages {"role": str, "content": str}'


def check_rows(rows: list[dict], where: str, prompt_key: str, functions: dict[str, str]) -> None:
    """Every row has the prompt column (`prompt_key`) in one of PROMPT_FORMS and the columns the
    built-in scoring functions read; `functions` maps a recipe key (reward.function) to its value;
    `where` names the file in errors (data.train 'x.jsonl')."""
    needed: dict[str, list[str]] = {}  # column -> the functions that read it ("reward.function 'synthetic'")
    for key, spec in functions.items():
        for column in COLUMNS_READ.get(spec, ()):
            needed.setdefault(column, []).append(f"{key} {spec!r}")
    for number, row in enumerate(rows, 1):
        problem = _prompt_problem(row, prompt_key) or _columns_problem(row, needed)
        if problem:
            raise UserError(f"{where}: row {number} {problem}")


def _prompt_problem(row: dict, key: str) -> str | None:
    if key not in row:
        return f"has no column {key!r} (data.prompt_key); columns: {', '.join(row)}"
    prompt = row[key]
    if isinstance(prompt, str):
        return None if prompt.strip() else f"has an empty {key!r}; give {PROMPT_FORMS}"
    if isinstance(prompt, list) and prompt:
        for index, message in enumerate(prompt, 1):
            problem = _message_problem(message)
            if problem:
                return f"has a {key!r} whose message {index} {problem}; give {PROMPT_FORMS}"
        return None
    what = "null" if prompt is None else "an empty list" if prompt == [] else f"a {type(prompt).__name__}"
    return f"has a {key!r} that is {what}; give {PROMPT_FORMS}"


def _message_problem(message) -> str | None:
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, not an object"
    for field in ("role", "content"):
        if field not in message:
            return f"has no {field!r}"
        if not isinstance(message[field], str):
            value = message[field]
            return f"has a {field!r} that is {'null' if value is None else 'a ' + type(value).__name__}"
    return None


def _columns_problem(row: dict, needed: dict[str, list[str]]) -> str | None:
    missing = [column for column in needed if column not in row]
    if not missing:
        return None
    readers = sorted({reader for column in missing for reader in needed[column]})
    return (f"has no column {', '.join(map(repr, missing))} (read by {' and '.join(readers)}); "
            f"columns: {', '.join(row)}")
