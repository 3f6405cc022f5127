"""PtxData: the pretraining texts of PPO-ptx, tokenized with an end-of-text token and cut to
`ppo.ptx_max_length`; each step's draw is a function of (seed, step); off means an empty batch.

The tiny tokenizer is character-level: id = 3 + position in TINY_CHARS, <pad> 0, <eos> 2."""

import json

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import TINY_CHARS, build_tiny_tokenizer
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.data.ptx import PtxData

PAD, EOS = 0, 2
TEXTS = ["ab", "hello there", "x", "", "digits 123"]


def ids(text: str) -> list[int]:
    return [3 + TINY_CHARS.index(c) for c in text]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory holding only the tiny tokenizer: all PtxData loads from it."""
    path = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer().save_pretrained(path)
    return path


def _ptx(model_dir, tmp_path, texts=TEXTS, seed=0, **ppo):
    data = tmp_path / "ptx.jsonl"
    data.write_text("".join(json.dumps({"text": t, "source": "web"}) + "\n" for t in texts))
    recipe = build_recipe({
        "seed": seed, "model": {"path": str(model_dir)}, "data": {"train": "synthetic:digits"},
        "ppo": {"ptx_coef": 0.5, "ptx_data": str(data), "ptx_max_length": 6, **ppo},
    }, {}, "test")
    return PtxData.from_recipe(recipe)


def test_texts_end_in_eos_are_cut_and_single_tokens_dropped(model_dir, tmp_path):
    ptx = _ptx(model_dir, tmp_path)
    # "" + eos is one token, nothing to predict: dropped. The rest cut to 6 tokens.
    assert ptx.rows == [ids("ab") + [EOS], ids("hello "), ids("x") + [EOS], ids("digits")]
    assert ptx.pad_id == PAD and ptx


def test_a_step_draws_the_same_rows_every_time(model_dir, tmp_path):
    ptx = _ptx(model_dir, tmp_path)
    again = _ptx(model_dir, tmp_path)  # a resumed run's fresh copy
    for step in (1, 2, 7):
        torch.testing.assert_close(ptx.batch(step, 8).tensors, again.batch(step, 8).tensors, rtol=0, atol=0)
    assert not torch.equal(ptx.batch(1, 8)["ptx_input_ids"], ptx.batch(2, 8)["ptx_input_ids"])
    other_seed = _ptx(model_dir, tmp_path, seed=1)
    assert not torch.equal(ptx.batch(1, 8)["ptx_input_ids"], other_seed.batch(1, 8)["ptx_input_ids"])


def test_the_batch_is_right_padded_rows_with_their_mask(model_dir, tmp_path):
    ptx = _ptx(model_dir, tmp_path)
    batch = ptx.batch(3, 16)
    assert batch.keys() == ["ptx_input_ids", "ptx_attention_mask"] and not batch.columns
    ids_, mask = batch["ptx_input_ids"], batch["ptx_attention_mask"]
    assert ids_.shape == mask.shape and ids_.shape[0] == 16 and ids_.dtype == torch.long
    drawn = []
    for row, row_mask in zip(ids_.tolist(), mask.tolist()):
        n = sum(row_mask)
        assert row_mask == [1] * n + [0] * (len(row) - n)  # ones, then padding
        assert row[n:] == [PAD] * (len(row) - n)
        drawn.append(row[:n])
    assert all(r in ptx.rows for r in drawn)
    assert ids_.shape[1] == max(len(r) for r in drawn)  # as wide as the longest drawn row
    assert len({tuple(r) for r in drawn}) > 1  # 16 draws from 4 rows are not all one row


def test_rows_are_placed_as_given_with_a_hand_built_pool():
    ptx = PtxData([[5, 6, 7]], pad_id=9, seed=0)  # one row: every draw is it
    batch = ptx.batch(1, 2)
    assert batch["ptx_input_ids"].tolist() == [[5, 6, 7], [5, 6, 7]]
    assert batch["ptx_attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]


def test_ptx_off_gives_an_empty_batch(model_dir, tmp_path):
    off = _ptx(model_dir, tmp_path, ptx_coef=0.0)
    assert not off and off.rows == []
    assert off.batch(1, 8) == Batch() and len(off.batch(1, 8)) == 0


def test_texts_too_short_are_a_user_error(model_dir, tmp_path):
    with pytest.raises(UserError, match=r"ppo.ptx_data '.*ptx.jsonl': no text longer than one token"):
        _ptx(model_dir, tmp_path, texts=["", "abc"], ptx_max_length=1)  # cut first, then dropped


def test_a_file_without_a_text_column_is_named(model_dir, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"body": "abc"}) + "\n")
    with pytest.raises(UserError, match=r"needs a `text` column; columns: body"):
        _ptx(model_dir, tmp_path, ptx_data=str(path))
