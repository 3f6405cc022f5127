"""Every row of a prompt file is checked before a run: the prompt and the reward's columns."""

import pytest

from hflow.errors import UserError
from hflow.trainer.data.row_checks import check_rows

CHAT = [{"role": "user", "content": "hi"}]


def _problem(rows, functions=None, prompt_key="prompt"):
    with pytest.raises(UserError) as raised:
        check_rows(rows, "data.train 'p.jsonl'", prompt_key, functions or {})
    return str(raised.value)


def test_good_rows_pass():
    check_rows([{"prompt": "a"}, {"prompt": CHAT}], "data.train 'p.jsonl'", "prompt", {})
    check_rows([{"q": "a", "task": "digits", "answer": "1"}], "x", "q", {"reward.function": "synthetic"})
    check_rows([{"prompt": "a"}], "x", "prompt", {"reward.function": "mymodule:score"})  # unknown: unchecked


def test_the_prompt_is_checked_in_every_row():
    rows = [{"prompt": "ok"}] * 7 + [{"text": "late"}]
    assert _problem(rows) == "data.train 'p.jsonl': row 8 has no column 'prompt' (data.prompt_key); columns: text"


@pytest.mark.parametrize("prompt, problem", [
    (None, "row 1 has a 'prompt' that is null; give a non-empty string or a list of chat messages"),
    ("  ", "row 1 has an empty 'prompt'"),
    (7, "row 1 has a 'prompt' that is a int"),
    ([], "row 1 has a 'prompt' that is an empty list"),
    ([{"role": "user"}], "row 1 has a 'prompt' whose message 1 has no 'content'"),
    ([*CHAT, {"role": "user", "content": None}], "whose message 2 has a 'content' that is null"),
    ([{"role": 1, "content": "x"}], "whose message 1 has a 'role' that is a int"),
    (["hi"], "whose message 1 is a str, not an object"),
])
def test_bad_prompts_are_named(prompt, problem):
    assert problem in _problem([{"prompt": prompt}])


def test_the_reward_functions_columns_are_checked_in_every_row():
    rows = [{"prompt": "a", "task": "digits", "answer": "1"}, {"prompt": "b"}]
    assert _problem(rows, {"reward.function": "synthetic"}) == (
        "data.train 'p.jsonl': row 2 has no column 'task', 'answer' (read by reward.function 'synthetic'); "
        "columns: prompt")
    both = {"reward.function": "exact_match", "cost.function": "exact_match"}
    assert "(read by cost.function 'exact_match' and reward.function 'exact_match')" in _problem(rows, both)
    check_rows(rows, "x", "prompt", {"reward.function": "length"})
