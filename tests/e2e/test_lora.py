"""LoRA through the CLI: a PPO run with adapters on the actor and the critic resumes exactly, its
reference is the actor itself (no reference worker), its checkpoints hold the adapters and its
`final/` a plain merged model plus the adapters; a LoRA recipe learns."""

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from helpers import read_events, resume_after_crash, run_hflow, train_run, write_recipe

COMPARED = ["reward/mean", "kl/mean", "actor/loss", "actor/grad_norm", "actor/lr", "critic/loss",
            "critic/grad_norm", "critic/lr"]


def _keys(path: Path) -> list[str]:
    with safe_open(str(path), "pt") as f:
        return list(f.keys())


@pytest.mark.slow
def test_lora_resume_equals_uninterrupted_and_the_actor_is_the_reference(tmp_path, tiny_model):
    lora = {"rank": 4, "alpha": 8, "dropout": 0.1}
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_model, algorithm="ppo", ppo={"kl_coef": 0.05},
        actor={"lr": 0.01, "lr_schedule": "cosine", "micro_batch_size": 8, "mini_batch_size": 16, "lora": lora},
        critic={"lr": 0.001, "micro_batch_size": 8, "mini_batch_size": 16, "lora": lora},
        trainer={"total_steps": 6, "prompts_per_step": 8, "save_every": 3, "keep_checkpoints": 3,
                 "output_dir": str(tmp_path / "runs")},
    )
    run, reference = train_run(recipe)
    plan = json.loads((run / "plan.json").read_text())
    assert set(plan["roles"]) == {"actor", "critic", "reward"}  # no second (reference) model
    # ... yet the KL to it is measured: 0 at step 1 (B starts at zero: adapters on = off), then not
    assert reference[0]["kl/mean"] == 0 and all(e["kl/mean"] != 0 for e in reference[1:])
    checkpoint = run / "checkpoints" / "step_000003"
    actor_keys = _keys(checkpoint / "actor" / "weights.safetensors")
    assert actor_keys and all(".lora_A." in k or ".lora_B." in k for k in actor_keys)
    critic_keys = _keys(checkpoint / "critic" / "weights.safetensors")
    assert "head.weight" in critic_keys and all(".lora_" in k for k in critic_keys if k != "head.weight")
    moments = {f"{m}/{k}" for m in ("exp_avg", "exp_avg_sq") for k in actor_keys}
    assert set(_keys(checkpoint / "actor" / "optimizer.safetensors")) == moments  # Adam holds only the adapters
    final = run / "final"
    assert "model.layers.0.self_attn.q_proj.weight" in _keys(final / "model.safetensors")
    assert (final / "adapter" / "adapter_config.json").is_file()

    again = resume_after_crash(run)
    assert [e["step"] for e in again] == [1, 2, 3, 4, 5, 6]
    for before, after in zip(reference[3:], again[3:]):
        for key in COMPARED:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)


@pytest.mark.slow
def test_the_tiny_lora_recipe_learns(tmp_path):
    result = run_hflow("train", "grpo/tiny_lora", "--output-dir", str(tmp_path / "runs"),
                       "--set", "trainer.total_steps=12", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = Path(result.stdout.strip().splitlines()[-1])
    run = run if run.is_absolute() else tmp_path / run
    events = read_events(run)
    first = sum(e["reward/mean"] for e in events[:3]) / 3
    last = sum(e["reward/mean"] for e in events[-3:]) / 3
    assert last >= first + 0.4, (first, last)
    assert "reference" not in json.loads((run / "plan.json").read_text())["roles"]
