"""`hflow import-gguf` and `hflow init-model smollm2-135m-instruct` through the real CLI."""

from __future__ import annotations

import json

import pytest

from helpers import assert_one_line_error, run_hflow

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
from gguf_files import tiny_llama, write_gguf  # noqa: E402


def test_import_gguf_writes_a_loadable_directory(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", tiny_llama(tied=True))
    result = run_hflow("import-gguf", str(path), str(tmp_path / "hf"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert {"model.safetensors", "tokenizer.json", "generation_config.json"} <= {p.name for p in (tmp_path / "hf").iterdir()}


def test_import_gguf_user_errors_are_one_line(tmp_path):
    odd = write_gguf(tmp_path / "odd.gguf", tiny_llama(tied=False), architecture="rwkv9")
    assert_one_line_error(run_hflow("import-gguf", str(odd), str(tmp_path / "out")), "'rwkv9'", "supported:", "llama")
    assert_one_line_error(run_hflow("import-gguf", str(tmp_path / "none.gguf"), str(tmp_path / "out")), "no such file")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert_one_line_error(run_hflow("init-model", "smollm2-135m-instruct", str(tmp_path / "full")), "not empty")
