"""A training step's memory, estimated before anything is allocated: the pure estimate against
hand-computed numbers, and `hflow validate` refusing in one line a step that cannot fit the
machine or a prompt + response longer than the model's context."""

import pytest

from helpers import assert_one_line_error, run_hflow, write_recipe
from hflow.errors import UserError
from hflow.trainer.config import step_memory
from hflow.trainer.config.load import build_recipe
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.config.step_memory import ModelDims, StepMemory


def test_the_estimate_by_hand():
    # 8 prompts x 4 responses = 32 sequences of 16 + 8 = 24 tokens: 32 x 24 x 64 B of rows;
    # the logits of 4 sequences' 8 response tokens over 55 words, float32 and gradient: 4 x 8 x 55 x 8;
    # the KV cache of 8 sequences decoded together, 24 positions, keys and values of 2 layers of
    # 4 heads x 16 dims in float32: 8 x 24 x 2 x 2 x 64 x 4.
    dims = ModelDims(layers=2, kv_dim=4 * 16, vocab=55)
    got = step_memory.step_memory(8, 4, 16, 8, decode_rows=8, micro_rows=4, dims=dims, dtype_bytes=4)
    assert got == StepMemory(rows=49_152, logits=14_080, kv_cache=196_608)
    assert got.total == 259_840
    # A scoring pass of 12 sequences (no gradient, float32 logits): 12 x 8 x 55 x 4 = 21,120 bytes,
    # more than the update's 14,080; one of 6 sequences (10,560) is less, and the update's counts.
    assert step_memory.step_memory(8, 4, 16, 8, 8, 4, dims, 4, score_rows=12).logits == 21_120
    assert step_memory.step_memory(8, 4, 16, 8, 8, 4, dims, 4, score_rows=6).logits == 14_080
    # Unknown model (no config to read): the rows only.
    assert step_memory.step_memory(8, 4, 16, 8, 8, 4, None, 4) == StepMemory(49_152, 0, 0)


def test_the_recipe_s_sizes_and_the_model_s_config(tiny_model):
    """The decoding batch is rollout.batch_size in whole prompt groups (at most the step), the
    micro-batch the actor's; layers, KV width and vocabulary come from config.json."""
    recipe = build_recipe({"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits",
                                                                       "max_prompt_length": 16},
                           "rollout": {"n": 3, "max_response_length": 8, "batch_size": 8},
                           "actor": {"micro_batch_size": 4}, "trainer": {"prompts_per_step": 4}}, {}, "r.yaml")
    dims = step_memory.model_dims(recipe)
    assert dims == ModelDims(layers=2, kv_dim=64, vocab=55, max_positions=1024)  # TINY_SHAPES["tiny"]
    got = step_memory.recipe_step_memory(recipe, dims)
    # 12 sequences x 24 tokens x 64 B; 4 x 8 x 55 x 8; 2 groups of 3 = 6 rows x 24 x 2 x 2 x 64 x 4.
    assert got == StepMemory(rows=18_432, logits=14_080, kv_cache=147_456)


def _check(recipe_data: dict, have_gib: float, monkeypatch):
    monkeypatch.setattr(step_memory, "machine_memory", lambda: int(have_gib * step_memory.GiB))
    check_runtime(build_recipe(recipe_data, {}, "r.yaml"), "r.yaml")


def test_a_step_over_the_machine_s_memory_is_refused_with_its_estimate(monkeypatch, tiny_model):
    # Rows: 64 prompts x 8 x (256 + 768) tokens x 64 B = 32 MiB = 0.03 GiB; logits: 8 x 768 x 55 x
    # 8 B = 2.6 MiB; KV: 64 rows x 1024 x 2 x 2 x 64 x 4 B = 64 MiB = 0.06 GiB. Total 0.096 GiB.
    data = {"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits"},
            "rollout": {"n": 8, "max_response_length": 768}, "trainer": {"prompts_per_step": 64, "device": "cpu"}}
    _check(data, 1.0, monkeypatch)  # fits
    with pytest.raises(UserError) as err:
        _check(data, 0.05, monkeypatch)
    line = str(err.value)
    assert line.startswith("r.yaml: one step needs about 0.10 GiB of this machine's memory (rows 0.03 "
                           "(64 prompts x 8 responses x 256+768 tokens), logits 0.00, KV cache 0.06 GiB), "
                           "more than its 0.05 GiB; lower trainer.prompts_per_step"), line
    # A GPU recipe: logits and KV cache are on the GPUs; its rows (0.03 GiB) fit the machine.
    _check({**data, "trainer": {"prompts_per_step": 64}, "cluster": {"gpu": "h100-80g"}}, 0.05, monkeypatch)


@pytest.mark.parametrize("key, needles", [
    ("trainer.prompts_per_step=1000000000", ["one step needs about", "1000000000 prompts x 4 responses", "GiB",
                                             "lower trainer.prompts_per_step"]),
    ("rollout.n=1000000000", ["one step needs about", "8 prompts x 1000000000 responses"]),
    ("rollout.max_response_length=1000000000", ["data.max_prompt_length 256 + rollout.max_response_length "
                                                "1000000000 = 1000000256 tokens", "max_position_embeddings 1024"]),
    ("rollout.max_response_length=800", ["256 + rollout.max_response_length 800 = 1056 tokens",
                                         "max_position_embeddings 1024"]),
])
def test_validate_refuses_sizes_that_cannot_run_in_one_line(tmp_path, tiny_model, key, needles):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, actor={"lr": 0.002, "micro_batch_size": 4})
    result = run_hflow("validate", str(recipe), "--set", key, timeout=120)
    assert_one_line_error(result, str(recipe), *needles)


def test_an_evaluation_s_decoding_batch_is_counted_where_it_holds_more(tiny_model):
    """eval.batch_size (else rollout.batch_size) in whole prompt groups, at the evaluation's longest
    response, counted as rows of the rollout's length holding as much KV cache; the larger of that
    and the rollout's decoding batch is the step's."""
    base = {"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits", "max_prompt_length": 16},
            "rollout": {"n": 3, "max_response_length": 8, "batch_size": 8},
            "actor": {"micro_batch_size": 4}, "trainer": {"prompts_per_step": 4}}
    dims = step_memory.model_dims(build_recipe(base, {}, "r.yaml"))
    kv_row = 24 * 2 * 2 * 64 * 4  # one row of 16 + 8 tokens: keys and values of 2 layers of 64, float32

    def rows(data: dict, eval_section: dict) -> tuple[int, int]:
        recipe = build_recipe({**base, "data": {**base["data"], **data}, "eval": eval_section}, {}, "r.yaml")
        return step_memory.eval_decode_rows(recipe), step_memory.recipe_step_memory(recipe, dims).kv_cache // kv_row

    assert rows({}, {}) == (0, 6)  # no evaluation: the rollout's 2 groups of 3
    # data.eval, greedy n=1, rollout.batch_size 8 at 16 + 8 tokens: 8 rows, more than the rollout's 6.
    assert rows({"eval": "synthetic:digits"}, {}) == (8, 8)
    # eval.batch_size 32 with responses of 40: 32 x (16 + 40) = 1,792 tokens = 74.7 -> 75 rows of 24.
    assert rows({"eval": "synthetic:digits"}, {"batch_size": 32, "max_response_length": 40}) == (75, 75)
    # eval.n 5 in a batch of 8: one group of 5 (whole groups), fewer than the rollout's 6.
    assert rows({"eval": "synthetic:digits"}, {"n": 5, "batch_size": 8}) == (5, 6)
    # A set at its own 16 tokens: its greedy pass 8 rows x 32 = 256 tokens (10.7 -> 11 rows of 24), more
    # than its sampled pass's 2 groups of k=3 (6 x 32 = 192).
    assert rows({}, {"batch_size": 8, "sets": [{"name": "s", "data": "synthetic:digits", "k": 3,
                                                "max_response_length": 16}]}) == (11, 11)


def test_a_too_large_evaluation_batch_is_refused_naming_its_key(monkeypatch, tiny_model):
    data = {"model": {"path": str(tiny_model)}, "data": {"train": "synthetic:digits", "eval": "synthetic:digits"},
            "rollout": {"n": 4, "max_response_length": 768, "batch_size": 32},
            "eval": {"batch_size": 4096}, "trainer": {"prompts_per_step": 8, "device": "cpu"}}
    # KV: 4,096 rows x (256 + 768) x 2 x 2 x 64 x 4 B = 4 GiB; at batch 32 the whole step is 0.04 GiB.
    _check({**data, "eval": {"batch_size": 32}}, 1.0, monkeypatch)
    with pytest.raises(UserError) as err:
        _check(data, 1.0, monkeypatch)
    line = str(err.value)
    assert "KV cache 4.00 GiB" in line and line.endswith("(or actor.micro_batch_size, eval.batch_size)"), line
