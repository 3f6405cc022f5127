"""`hflow train` with `rollout.engine: vllm` through the CLI, with the real vLLM (its CPU build
here): GRPO learns, and a run resumed from a checkpoint logs what the uninterrupted run logged."""


import pytest

from helpers import resume_after_crash, train_run, write_recipe

COMPARED = ["reward/mean", "kl/mean", "entropy/mean", "response_length/mean", "actor/loss",
            "actor/grad_norm", "actor/lr"]


@pytest.mark.slow
def test_grpo_with_vllm_learns_and_resumes_exactly(tmp_path, tiny_model, real_vllm):
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_model,
        rollout={"engine": "vllm", "n": 8, "max_response_length": 12},
        actor={"lr": 0.002, "micro_batch_size": 16, "mini_batch_size": 32},
        trainer={"total_steps": 12, "prompts_per_step": 8, "save_every": 6, "keep_checkpoints": 2,
                 "output_dir": str(tmp_path / "runs")},
        grpo={"kl_coef": 0.001},
    )
    run, reference = train_run(recipe)
    rewards = [e["reward/mean"] for e in reference]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.15, rewards  # it learned

    again = resume_after_crash(run, crashed_after=10, last=12)  # resumes from step 6
    assert [e["step"] for e in again] == list(range(1, 13))
    for before, after in zip(reference[6:], again[6:]):
        for key in COMPARED:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)
