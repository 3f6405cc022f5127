"""The model-folder check: a loadable folder passes; each way of breaking one is named."""

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from hflow.engine.models.folder import check_model_source, folder_problem, safetensors_problem
from hflow.errors import UserError


@pytest.fixture
def folder(tmp_path, tiny_model):
    return shutil.copytree(tiny_model, tmp_path / "m")


def test_the_tiny_model_passes(folder):
    assert folder_problem(folder) is None


@pytest.mark.parametrize("text, problem", [
    ("", "has an empty config.json"),
    ("{not json", "has a config.json that is not valid JSON"),
    ("[1, 2]", "not a JSON object (a list)"),
    ('{"hidden_size": 64}', "without a model_type"),
])
def test_a_broken_config_is_named(folder, text, problem):
    (folder / "config.json").write_text(text)
    assert problem in folder_problem(folder)


def test_missing_pieces_are_named(folder, tmp_path):
    (tmp_path / "empty").mkdir()
    assert folder_problem(tmp_path / "empty") == "is empty"
    (folder / "tokenizer.json").unlink()
    assert folder_problem(folder).startswith("has no tokenizer")
    assert folder_problem(folder, tokenizer=False) is None  # a critic or reference reads no tokenizer
    (folder / "vocab.json").write_text("{}")
    assert folder_problem(folder) is None  # tokenizer_config.json with its vocabulary
    (folder / "model.safetensors").unlink()
    assert folder_problem(folder).startswith("has no weights")
    (folder / "config.json").unlink()
    assert folder_problem(folder) == "has no config.json"


def test_safetensors_cut_short_or_too_long(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(2, 3)}, str(path))
    assert safetensors_problem(path) is None
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    assert f"cut short: {len(whole) - 1} bytes where its header says {len(whole)}" in safetensors_problem(path)
    path.write_bytes(whole[:20])
    assert "less than its" in safetensors_problem(path)
    path.write_bytes(whole[:5])
    assert "before its 8-byte header length" in safetensors_problem(path)
    path.write_bytes(whole + b"\0")
    assert f"where its header says {len(whole)}" in safetensors_problem(path)
    path.write_bytes((4).to_bytes(8, "little") + b"nope")
    assert "header is not safetensors JSON" in safetensors_problem(path)


def test_sharded_weights_need_every_shard(folder):
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    save_file({"x": torch.zeros(2)}, str(folder / "model-00002-of-00002.safetensors"))
    index = {"weight_map": {"w1": "model-00001-of-00002.safetensors", "x": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert folder_problem(folder) is None
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert "has no model-00002-of-00002.safetensors, a shard that model.safetensors.index.json lists" \
        in folder_problem(folder)


def test_check_model_source_names_the_key_and_leaves_hub_ids_alone(folder):
    (folder / "config.json").write_text("")
    with pytest.raises(UserError, match=rf"^critic.path: model folder '{folder}' has an empty config.json; "
                                        "give a Hugging Face model folder: config.json with a model_type"):
        check_model_source(str(folder), "critic.path")
    check_model_source("some-org/some-model", "model.path")  # a hub id: the hub's cache decides
