"""PromptData: a step's prompts are a pure function of (seed, step), each epoch visits every
prompt once, prompts are cut from the left, chat prompts go through the chat template.

The tiny tokenizer is character-level (one token per character, id = 3 + position in
TINY_CHARS), so expected token ids are written down by hand from the text."""

import json

import pytest

from hflow.engine.models.loading import TINY_CHARS, build_tiny_tokenizer
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.data.prompts import PromptData
from hflow.trainer.data.rows import read_table

PROMPTS = [f"prompt {c}" for c in "abcdefghij"]  # 10 distinct prompts


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def ids(text: str) -> list[int]:
    return [3 + TINY_CHARS.index(c) for c in text]


def _data(tokenizer, train, seed=0, per_step=4, **data):
    recipe = build_recipe({"model": {"path": "unused"}, "data": {"train": str(train), **data}}, {}, "test")
    return PromptData(recipe.data, tokenizer, seed, per_step)


def _jsonl(tmp_path, rows, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _epochs(data, steps):
    return [p for step in range(1, steps + 1) for p in data.batch(step)["prompt"]]


def test_each_epoch_visits_every_prompt_once_in_a_new_order(tmp_path, tokenizer):
    data = _data(tokenizer, _jsonl(tmp_path, [{"prompt": p} for p in PROMPTS]), per_step=5)
    seen = _epochs(data, 4)  # 4 steps of 5 = two epochs of 10
    first, second = seen[:10], seen[10:]
    assert sorted(first) == PROMPTS and sorted(second) == PROMPTS
    assert first != PROMPTS and first != second  # shuffled, and reshuffled per epoch


def test_a_step_across_an_epoch_end_takes_the_rest_then_the_next_epoch(tmp_path, tokenizer):
    data = _data(tokenizer, _jsonl(tmp_path, [{"prompt": p} for p in PROMPTS]), per_step=4)
    batch = data.batch(3)  # positions 8, 9 of epoch 0, then 0, 1 of epoch 1
    assert batch["uid"] == [8, 9, 10, 11]
    assert batch["prompt"][:2] == _epochs(data, 3)[8:10]
    assert batch["prompt"][2:] == _epochs(data, 5)[10:12]
    assert batch.meta == {"step": 3}


def test_without_shuffle_the_file_order_repeats(tmp_path, tokenizer):
    data = _data(tokenizer, _jsonl(tmp_path, [{"prompt": p} for p in PROMPTS]), per_step=4, shuffle=False)
    assert _epochs(data, 5) == PROMPTS + PROMPTS


def test_batches_are_fixed_by_the_seed(tokenizer):
    def steps(seed):
        data = _data(tokenizer, "synthetic:echo", seed=seed, synthetic_size=16)
        return [data.batch(s)["prompt"] for s in (1, 2, 5)]

    assert steps(0) == steps(0)
    assert steps(0) != steps(1)


def test_a_resumed_run_sees_the_same_prompts(tmp_path, tokenizer):
    path = _jsonl(tmp_path, [{"prompt": p} for p in PROMPTS])
    uninterrupted = _data(tokenizer, path, per_step=3)
    walked = {step: uninterrupted.batch(step) for step in range(1, 9)}
    resumed = _data(tokenizer, path, per_step=3)  # a fresh process that starts at step 7
    assert resumed.batch(7) == walked[7]
    assert resumed.batch(2) == walked[2]  # and going back to an earlier epoch still agrees
    assert resumed.batch(8) == walked[8]


def test_prompts_are_cut_from_the_left(tmp_path, tokenizer):
    path = _jsonl(tmp_path, [{"prompt": "abcdefgh"}, {"prompt": "xyz"}])
    data = _data(tokenizer, path, per_step=2, shuffle=False, max_prompt_length=5)
    assert data.batch(1)["prompt_ids"] == [ids("defgh"), ids("xyz")]


def test_chat_prompts_go_through_the_chat_template(tmp_path, tokenizer):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    data = _data(tokenizer, _jsonl(tmp_path, [{"prompt": chat}]), per_step=1)
    assert data.batch(1)["prompt_ids"] == [ids("system: be brief\nuser: hi\nassistant: ")]
    cut = _data(tokenizer, _jsonl(tmp_path, [{"prompt": chat}]), per_step=1, max_prompt_length=15)
    assert cut.batch(1)["prompt_ids"] == [ids(" hi\nassistant: ")]  # the last 15 characters


def test_columns_are_kept_and_the_prompt_key_is_renamed(tmp_path, tokenizer):
    path = _jsonl(tmp_path, [{"question": "two", "answer": "2"}])
    batch = _data(tokenizer, path, per_step=2, prompt_key="question").batch(1)
    assert batch.columns == {"answer": ["2", "2"], "prompt": ["two", "two"],
                             "prompt_ids": [ids("two"), ids("two")], "uid": [0, 1]}


def test_an_empty_or_null_prompt_is_an_error_naming_its_row(tmp_path, tokenizer):
    with pytest.raises(UserError, match=r"p.jsonl': row 2 has an empty 'prompt'"):
        _data(tokenizer, _jsonl(tmp_path, [{"prompt": "ok"}, {"prompt": ""}], "p.jsonl"))
    with pytest.raises(UserError, match=r"row 1 has a 'prompt' that is null"):  # not trained on as "None"
        _data(tokenizer, _jsonl(tmp_path, [{"prompt": None}], "null.jsonl"))


def test_a_missing_prompt_column_is_named(tmp_path, tokenizer):
    path = _jsonl(tmp_path, [{"text": "a", "answer": "b"}])
    with pytest.raises(UserError, match=r"no column 'prompt' \(data.prompt_key\); columns: text, answer"):
        _data(tokenizer, path)


def test_a_file_that_does_not_parse_is_one_line(tmp_path):
    fake = tmp_path / "p.parquet"
    fake.write_text('{"prompt": "a"}\n')
    with pytest.raises(UserError, match=r"^data.train '.*p.parquet': not a readable parquet file \(.+\)$"):
        read_table(str(fake), "data.train", "a prompt column")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match=r"b.jsonl: not a UTF-8 text file of JSON lines"):
        read_table(str(binary), "data.train", "a prompt column")


def test_parquet_chat_prompts_pass_the_row_checks(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "hi"}]}]), path)
    assert _data(tokenizer, path, per_step=1).batch(1)["prompt"] == [[{"role": "user", "content": "hi"}]]
