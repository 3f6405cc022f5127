"""Resume equals an uninterrupted run for PPO and Safe-RLHF: critics' DeepSpeed states, the
adaptive KL coefficient, the Lagrange multiplier and the PTX draws all continue exactly."""

import json

import pytest

from helpers import resume_after_crash, train_run, write_recipe

COMPARED = ["reward/mean", "kl/mean", "kl/coef", "actor/loss", "actor/grad_norm", "actor/lr",
            "critic/loss", "critic/grad_norm", "critic/vf_explained_var", "critic/lr"]
ALGORITHMS = {
    "ppo": ({"kl_coef": 0.05, "kl_target": 0.5, "kl_horizon": 100, "ptx_coef": 0.5},
            ["actor/ptx_loss"]),
    "safe_rlhf": ({"kl_coef": 0.05}, ["cost/mean", "lagrange/lambda", "cost_critic/loss", "cost_critic/grad_norm"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_resume_equals_uninterrupted_with_critics(tmp_path, tiny_model, algorithm):
    ppo, extra_keys = ALGORITHMS[algorithm]
    ptx = tmp_path / "ptx.jsonl"
    ptx.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["write digits: 0123", "say q: qqqq", "hello"]))
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_model, algorithm=algorithm,
        ppo={**ppo, "ptx_data": str(ptx)} if "ptx_coef" in ppo else ppo,
        cost={"function": "synthetic_cost"},
        safe_rlhf={"cost_limit": 0.05, "lambda_lr": 1.0, "episode_cost_window": 48},
        actor={"lr": 0.002, "lr_schedule": "cosine", "warmup_steps": 2, "micro_batch_size": 8, "mini_batch_size": 16},
        critic={"lr": 0.001, "lr_schedule": "linear", "micro_batch_size": 8, "mini_batch_size": 16},
        trainer={"total_steps": 6, "prompts_per_step": 8, "save_every": 3, "keep_checkpoints": 3,
                 "output_dir": str(tmp_path / "runs")},
    )
    run, reference = train_run(recipe)
    state = json.loads((run / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert "kl_controller" in state and ("lagrangian" in state) == (algorithm == "safe_rlhf")
    roles = {p.name for p in (run / "checkpoints" / "step_000003").iterdir() if p.is_dir()}
    assert roles == ({"actor", "critic", "cost_critic"} if algorithm == "safe_rlhf" else {"actor", "critic"})

    again = resume_after_crash(run)
    assert [e["step"] for e in again] == [1, 2, 3, 4, 5, 6]
    for before, after in zip(reference[3:], again[3:]):
        for key in COMPARED + extra_keys:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)
    # The run moved: the controllers' state is not constant, so resuming it is a real test.
    moving = "kl/coef" if algorithm == "ppo" else "lagrange/lambda"
    assert reference[0][moving] != reference[-1][moving]
