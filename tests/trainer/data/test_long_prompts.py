"""A prompt far longer than data.max_prompt_length is cut to its last characters before it is
tokenized (a 10 MB line once took gigabytes and tens of seconds, deaf to SIGTERM), keeping the
same last tokens; a stop signal ends the loading at once."""

import json
import os
import random
import signal
import threading
import time

import pytest

from hflow.engine.models.loading import TINY_CHARS, build_tiny_tokenizer
from hflow.trainer.config.load import build_recipe
from hflow.trainer.stop import Terminated, stop_signals
from hflow.trainer.data.prompts import PromptData, encode_prompt, prompt_char_limit


class Recording:
    """A tokenizer that notes how many characters it is asked to tokenize (and may pause per call)."""

    def __init__(self, tokenizer, pause_s: float = 0.0):
        self.tokenizer, self.pause_s, self.seen = tokenizer, pause_s, []

    def __call__(self, text, **kwargs):
        self.seen.append(len(text))
        time.sleep(self.pause_s)
        return self.tokenizer(text, **kwargs)

    def apply_chat_template(self, messages, **kwargs):
        self.seen.append(sum(len(m["content"]) for m in messages))
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def get_vocab(self):
        return self.tokenizer.get_vocab()


def _data(tokenizer, tmp_path, rows, max_prompt_length=16):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = build_recipe({"model": {"path": "unused"}, "data": {"train": str(path), "shuffle": False,
                                                                 "max_prompt_length": max_prompt_length}}, {}, "t")
    return PromptData(recipe.data, tokenizer, 0, 1)


def ids(text: str) -> list[int]:
    return [3 + TINY_CHARS.index(c) for c in text]


def test_a_10_mb_prompt_is_cut_before_it_is_tokenized(tmp_path):
    tokenizer = Recording(build_tiny_tokenizer())
    text = "write digits: " * 750_000 + "the end"  # 10.5 MB
    chat = [{"role": "user", "content": text}]
    data = _data(tokenizer, tmp_path, [{"prompt": text}, {"prompt": chat}])
    limit = prompt_char_limit(tokenizer, 16)
    assert limit == 17 * 5  # the tiny vocabulary's longest entry: "<pad>"
    assert max(tokenizer.seen) <= limit  # never the whole text
    assert data.rows[0]["prompt_ids"] == ids(text[-16:])  # the same last 16 tokens
    assert data.batch(1)["prompt"] == [text[-limit:]]  # what the reward and samples.jsonl see
    assert data.rows[1]["prompt_ids"] == ids(f"user: {text}\nassistant: "[-16:])  # the tiny chat template


def test_the_cut_keeps_a_byte_level_bpe_s_last_tokens(tmp_path):
    """With a BPE whose tokens span several characters, the cut text's last tokens are the whole
    text's (`prompt_char_limit` bounds a token by its longest vocabulary entry)."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "42", "1000", ",", ".", "\n"]
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(50)]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=400, min_frequency=1)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    text = " ".join(rng.choice(words) for _ in range(20_000))
    for max_length in (1, 7, 64, 300):
        assert len(text) > prompt_char_limit(tokenizer, max_length)  # the cut happens
        whole = tokenizer(text, add_special_tokens=False)["input_ids"][-max_length:]
        assert encode_prompt(tokenizer, text, max_length) == whole, max_length


def test_sigterm_while_prompts_load_stops_the_loading_at_once(tmp_path):
    """SIGTERM one second into the loading raises Terminated there (hflow train: exit 143), not after
    the tokenizer is done with a 4 MB line (13 s and more here, inside one call)."""
    tokenizer = Recording(build_tiny_tokenizer(), pause_s=0.005)  # ~10 s for the short rows
    rows = [{"prompt": "write digits: " * 300_000}] + [{"prompt": f"prompt {i}"} for i in range(2000)]
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    with stop_signals():
        start = time.monotonic()
        timer.start()
        with pytest.raises(Terminated):
            _data(tokenizer, tmp_path, rows)
        stopped_after = time.monotonic() - start
    timer.cancel()
    assert len(tokenizer.seen) < len(rows)  # it stopped before the end
    assert stopped_after < 6
