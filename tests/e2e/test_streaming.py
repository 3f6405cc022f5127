"""Streamed steps (`rollout.stream_prompts`) through the real CLI: the reward stage starts before
generation ends (every row's recorded times show it) and the run learns; the local backend's
threaded stream, the ray backend's futures on split pools, and async mode at max_staleness 0
all train on exactly the same rows; on two actor ranks each row keeps its own old log-probs;
a bad chunk size is one line."""

import math
import os
from pathlib import Path

import pytest
from helpers import RUN_VARYING, assert_recipe_error, assert_same_events, train_run, write_recipe

pytestmark = pytest.mark.slow
TESTS = Path(__file__).resolve().parents[1]
# What differs between runs of the same rows by design: wall-clock times, memory, async/*.
NOT_COMPARED = (*RUN_VARYING, "async/", "stream/reward_lead_s")


def _streamed(tmp_path: Path, model: Path, name: str, steps: int, response_length: int = 8,
              **sections) -> list[dict]:
    trainer = {"total_steps": steps, "prompts_per_step": 8, "save_every": 0,
               "output_dir": str(tmp_path / name), **sections.pop("trainer", {})}
    recipe = write_recipe(tmp_path / f"{name}.yaml", model, trainer=trainer,
                          rollout={"n": 4, "max_response_length": response_length, "stream_prompts": 2, "batch_size": 8},
                          actor={"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 16}, **sections)
    _, events = train_run(recipe)
    return events


def _same_rows(want: list[dict], got: list[dict]) -> None:
    assert_same_events(want, got, NOT_COMPARED, ("actor/loss", "reward/mean", "stream/chunks"))


def test_a_streamed_step_scores_chunks_while_generating_and_learns(tmp_path, tiny_model):
    events = _streamed(tmp_path, tiny_model, "local", 12)
    assert all(e["stream/chunks"] == 4 for e in events)
    # Every step reports how far scoring ran ahead of generation; that it does run ahead is shown by
    # order in tests/trainer/streaming/test_chunks.py (a clock on a loaded machine can say either).
    assert all(math.isfinite(e["stream/reward_lead_s"]) for e in events)
    first = sum(e["reward/mean"] for e in events[:3]) / 3
    last = sum(e["reward/mean"] for e in events[-3:]) / 3
    assert last > first + 0.05, (first, last)


def test_streaming_on_ray_split_pools_and_async_at_staleness_0_train_on_the_same_rows(tmp_path, tiny_model):
    pytest.importorskip("ray")
    # Responses long enough that a chunk's generation outlasts a Ray round trip (~10 ms here).
    local = _streamed(tmp_path, tiny_model, "local", 3, 32)
    ray_split = _streamed(tmp_path, tiny_model, "ray", 3, 32, placement={"backend": "ray", "mode": "split"},
                          cluster={"cpu_slots": 2})
    async_0 = _streamed(tmp_path, tiny_model, "async", 3, 32, trainer={"mode": "async", "max_staleness": 0})
    _same_rows(local, ray_split)
    _same_rows(local, async_0)
    assert all(math.isfinite(e["stream/reward_lead_s"]) for e in ray_split)
    assert local[0]["actor/loss"] != local[-1]["actor/loss"]


@pytest.mark.parametrize("overrides, needles", [
    (["rollout.stream_prompts=3"], ["rollout.stream_prompts=3", "trainer.prompts_per_step=8", "divisor"]),
])
def test_a_chunk_size_that_does_not_divide_the_step_is_one_line(overrides, needles):
    assert_recipe_error("grpo/quickstart", overrides, needles)


def test_streaming_a_loop_it_does_not_stream_is_one_line():
    assert_recipe_error("ppo/tiny", ["rollout.stream_prompts=2"], ["rollout.stream_prompts", "algorithm ppo",
                                                                     "stream_prompts: 0"])


def test_on_two_actor_ranks_a_streamed_step_keeps_each_row_s_old_log_probs(tmp_path, tiny_model):
    # At step 1 the policy is the reference: the KL between a row's old and reference log-probs
    # is 0 when each row gets its own. Joining the actor's per-rank results onto the chunks on the
    # controller once gave rows in chunk order the results in rank order (kl/mean 0.02 here).
    pytest.importorskip("ray")
    events = _streamed(tmp_path, tiny_model, "dp2", 1, 16, placement={"backend": "ray", "mode": "colocate"},
                       cluster={"cpu_slots": 2}, grpo={"kl_coef": 0.001})
    assert events[0]["stream/chunks"] == 4 and abs(events[0]["kl/mean"]) < 1e-6, events[0]["kl/mean"]
