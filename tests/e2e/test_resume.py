"""A run resumed from a checkpoint logs the same metrics as the uninterrupted run."""

import json

import pytest

from hflow.engine.kernels.cpu_products import onednn_available
from hflow.engine.kernels.product_route import parse_route
from helpers import resume_after_crash, train_run, write_recipe

COMPARED = ["reward/mean", "kl/mean", "entropy/mean", "response_length/mean", "actor/loss",
            "actor/grad_norm", "actor/lr"]


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage, dtype", [(1, "float32"), (3, "float32"), (0, "bfloat16")])
def test_resume_equals_uninterrupted(tmp_path, tiny_model, zero_stage, dtype):
    """bf16 with ZeRO-0, the GPU's default dtype without ZeRO, used to fail at its first checkpoint
    (DeepSpeed keys Adam's state by fp32 masters there: `engine/training/master_state.py`)."""
    recipe = write_recipe(
        tmp_path / "r.yaml", tiny_model,
        actor={"lr": 0.002, "lr_schedule": "cosine", "warmup_steps": 2, "zero_stage": zero_stage,
               "micro_batch_size": 8, "mini_batch_size": 16},
        trainer={"total_steps": 6, "prompts_per_step": 8, "save_every": 3, "keep_checkpoints": 3,
                 "output_dir": str(tmp_path / "runs")},
        grpo={"kl_coef": 0.01},
    )
    recipe.write_text(recipe.read_text().replace("model:\n", f"model:\n  dtype: {dtype}\n"))
    run, reference = train_run(recipe)

    again = resume_after_crash(run)
    assert [e["step"] for e in again] == [1, 2, 3, 4, 5, 6]
    for before, after in zip(reference[3:], again[3:]):
        for key in COMPARED:
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-7), (after["step"], key)
    # the policy moved: learning happened between the first and last step
    assert reference[0]["actor/lr"] != reference[-1]["actor/lr"]


@pytest.mark.slow
def test_resume_before_the_first_checkpoint_starts_over_without_repeating_steps(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model,
                          trainer={"total_steps": 3, "prompts_per_step": 8, "save_every": 0,
                                   "output_dir": str(tmp_path / "runs")})
    run, reference = train_run(recipe)

    again = resume_after_crash(run, crashed_after=2, last=3)  # no checkpoint existed at the crash
    assert [e["step"] for e in again] == [1, 2, 3]
    samples = [json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples == sorted(samples) and samples.count(1) == samples.count(3)  # each step's samples once
    for before, after in zip(reference, again):
        assert after["reward/mean"] == before["reward/mean"] and after["actor/loss"] == before["actor/loss"]


@pytest.mark.slow
@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN in torch: otherwise there is no choice")
def test_a_resume_computes_its_cpu_products_as_the_run_began(tmp_path, tiny_model):
    """The product kernels a CPU run chose when it began (plan.json) hold on a resume, whatever a new
    measurement would say: here the record is turned to the other choice, and the resume keeps it."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model,
                          trainer={"total_steps": 3, "prompts_per_step": 4, "save_every": 2,
                                   "output_dir": str(tmp_path / "runs")})
    run, _ = train_run(recipe)
    plan = json.loads((run / "plan.json").read_text())
    began = plan["cpu_products"]
    assert parse_route(began) is not None
    other = "onednn" if began == "blas" else "blas"
    (run / "plan.json").write_text(json.dumps({**plan, "cpu_products": other}))
    again = resume_after_crash(run, crashed_after=2, last=3)
    assert [e["step"] for e in again] == [1, 2, 3]
    assert json.loads((run / "plan.json").read_text())["cpu_products"] == other
