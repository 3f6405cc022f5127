"""The data preparation script's conversions, on hand-made rows (nothing is downloaded)."""

from hflow.recipes.prepare_data import gsm8k_rows, hh_dialogue, pku_rows
from hflow.trainer.data.rewards import exact_match


def test_hh_dialogue_drops_the_last_assistant_turn():
    text = "\n\nHuman: hi\n\nAssistant: hello!\n\nHuman: how are you?\n\nAssistant: fine."
    assert hh_dialogue(text) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"},
                                 {"role": "user", "content": "how are you?"}]
    assert hh_dialogue("no turns here") is None


def test_gsm8k_rows_keep_the_answer_for_exact_match():
    (row,) = gsm8k_rows([{"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}])
    assert row["prompt"][0]["role"] == "user" and "####" in row["prompt"][0]["content"]
    assert exact_match([""], ["so the answer is #### 2"], answer=[row["answer"]]) == [1.0]


def test_pku_prompts_are_deduplicated():
    rows = list(pku_rows([{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}]))
    assert [r["prompt"][0]["content"] for r in rows] == ["a", "b"]
