"""A GGUF file written locally (no download): a tiny transformers Llama with llama.cpp's tensor
names and q/k row order, and a byte-level BPE tokenizer, for the GGUF import tests."""

from __future__ import annotations

import gguf
import numpy as np
import torch

CHAT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf.py, LlamaModel.permute); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(tied: bool):
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
            array = permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = permute(array, kv)
        w.add_tensor(names[name], np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
