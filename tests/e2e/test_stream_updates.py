"""Streamed updates (`trainer.stream_updates`) through the real CLI: without recomputed old
log-probs a streamed step trains exactly as the unstreamed one, on the local backend and on ray
split pools; with them the first mini-batch is trained before the step's last row is generated,
the run learns, and a resumed run trains its last steps again exactly; a recipe it cannot run
is one line."""

import os
from pathlib import Path

import pytest
from helpers import (RUN_VARYING, assert_recipe_error, assert_same_events, resume_after_crash, train_run,
                     write_recipe)

pytestmark = pytest.mark.slow
NOT_COMPARED = (*RUN_VARYING, "async/", "stream/")


def _async_run(tmp_path: Path, model: Path, name: str, steps: int, stream_updates: bool, rollout: dict,
               actor: dict, save_every: int = 0, **sections) -> tuple[Path, list[dict]]:
    trainer = {"total_steps": steps, "prompts_per_step": 8, "save_every": save_every, "mode": "async",
               "max_staleness": 0, "stream_updates": stream_updates, "output_dir": str(tmp_path / name)}
    recipe = write_recipe(tmp_path / f"{name}.yaml", model, trainer=trainer,
                          rollout={"n": 4, "batch_size": 8, **rollout}, actor={"lr": 0.002, **actor}, **sections)
    return train_run(recipe)


def _same(want: list[dict], got: list[dict]) -> None:
    assert_same_events(want, got, NOT_COMPARED, ("actor/loss", "actor/grad_norm", "tokens/trained"))


def test_without_recomputed_old_log_probs_a_streamed_step_trains_as_the_unstreamed_one(tmp_path, tiny_model):
    pytest.importorskip("ray")
    # 8 prompts x 4 = 32 rows a step in 4 chunks of 8; mini-batches of 16 rows: 2 per step.
    same = dict(rollout={"max_response_length": 16, "stream_prompts": 2},
                actor={"micro_batch_size": 16, "mini_batch_size": 16, "recompute_old_log_probs": False})
    _, unstreamed = _async_run(tmp_path, tiny_model, "unstreamed", 3, False, **same)
    _, streamed = _async_run(tmp_path, tiny_model, "streamed", 3, True, **same)
    _, on_ray = _async_run(tmp_path, tiny_model, "ray", 3, True, **same,
                           placement={"backend": "ray", "mode": "split"}, cluster={"cpu_slots": 2})
    for runs in (streamed, on_ray):
        _same(unstreamed, runs)
        assert all(e["stream/mini_batches"] == 2 for e in runs) and "stream/mini_batches" not in unstreamed[0]
    assert unstreamed[0]["actor/loss"] != unstreamed[-1]["actor/loss"]  # the policy moved


def test_the_first_mini_batch_trains_while_the_step_still_generates_the_run_learns_and_resumes(tmp_path,
                                                                                               tiny_model):
    # A chunk per prompt (8 a step), mini-batches of 2 chunks: the first trains while 6 chunks
    # are still to be generated. Old log-probs recomputed per mini-batch, TIS against the sampler.
    run, events = _async_run(tmp_path, tiny_model, "learns", 12, True, save_every=6,
                             rollout={"max_response_length": 24, "stream_prompts": 1},
                             actor={"micro_batch_size": 8, "mini_batch_size": 8, "off_policy_correction": "tis"})
    assert all(e["stream/mini_batches"] == 4 and e["async/staleness_max"] == 0 for e in events)
    # Trained before the step's last row was generated in most steps: whether a step overlaps is a
    # race between the generator and one mini-batch's scoring and update (a faster generator loses
    # it now and then; `tests/trainer/streaming/` paces one to show each step's order), but a
    # trainer that waited for the whole step would lose it in every step.
    leads = [e["stream/update_lead_s"] for e in events]
    assert sum(lead > 0 for lead in leads) > len(leads) // 2, leads
    assert all(0 < e["actor/off_policy_weight"] <= 2.0 for e in events)
    first = sum(e["reward/mean"] for e in events[:3]) / 3
    last = sum(e["reward/mean"] for e in events[-3:]) / 3
    assert last > first + 0.1, (first, last)
    # A crash after step 10, the last checkpoint at 6: steps 7-12 train again exactly as before.
    _same(events, resume_after_crash(run, crashed_after=10, last=12))


ASYNC = ["trainer.mode=async", "trainer.stream_updates=true"]


@pytest.mark.parametrize("overrides, needles", [  # grpo/quickstart: 8 prompts x n 8 = 64 rows a step
    (["trainer.stream_updates=true", "rollout.stream_prompts=2"], ["trainer.stream_updates", "trainer.mode: async"]),
    ([*ASYNC, "rollout.stream_prompts=2", "algorithm=reinforce_pp"], ["algorithm reinforce_pp", "(grpo, rloo, gspo)"]),
    (ASYNC, ["rollout.stream_prompts > 0"]),
    ([*ASYNC, "rollout.stream_prompts=2", "actor.epochs=2"], ["actor.epochs=2", "actor.epochs: 1"]),
    ([*ASYNC, "rollout.stream_prompts=4", "actor.mini_batch_size=16"], ["actor.mini_batch_size (16)", "32 rows"]),
    ([*ASYNC, "rollout.stream_prompts=2", "actor.mini_batch_size=64"], ["actor.mini_batch_size (64)",
                                                                         "below the step's 64"]),
])
def test_a_recipe_streamed_updates_cannot_run_is_one_line(overrides, needles):
    assert_recipe_error("grpo/quickstart", overrides, needles)
