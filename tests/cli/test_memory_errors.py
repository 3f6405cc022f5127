"""A GPU recipe whose models do not fit its GPUs as hflow runs them (ZeRO data parallelism; each frozen
model a full copy per GPU, or partitioned under the actor's ZeRO-3): `hflow validate` and `hflow train`
stop with one line naming the file, the pool and its roles, the GB per GPU against the usable memory,
and what would fit; exit code 2."""

import pytest
import yaml

from helpers import assert_one_line_error, run_hflow
from hflow.errors import UserError
from hflow.mapper.workload import ROLES, workload_from_recipe
from hflow.trainer.config.load import build_recipe, load_recipe
from hflow.trainer.control.preflight import check_runtime
from hflow.trainer.placement.memory_check import check_memory

LLAMA7 = "meta-llama/Llama-2-7b-hf"  # in the mapper's catalog: a hub id is enough, nothing is read
GRPO_7B = {  # GRPO on 4 A100-80GB: the actor and a reference (the KL term) on one pool
    "rollout": {"n": 4, "max_response_length": 256, "batch_size": 16},
    "data": {"max_prompt_length": 256},
    "actor": {"micro_batch_size": 4, "mini_batch_size": 64, "zero_stage": 1},
    "trainer": {"prompts_per_step": 16},
    "model": {"dtype": "bfloat16", "gradient_checkpointing": True},
    "cluster": {"gpus": 4, "gpu": "a100-80g"},
}


@pytest.fixture(autouse=True)
def _no_visible_gpu(monkeypatch):
    """The check must not depend on the GPUs of the machine running the tests."""
    monkeypatch.setattr("hflow.trainer.placement.memory_check.visible_gpus", lambda: 0)
    monkeypatch.setattr("hflow.trainer.placement.memory_check.detect_gpu", lambda: None)


def _data(model: str = LLAMA7, **sections) -> dict:
    data = {"model": {"path": model}, "data": {"train": "synthetic:digits"}}
    for source in (GRPO_7B, sections):
        for key, value in source.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return data


def _recipe(model: str = LLAMA7, **sections):
    return build_recipe(_data(model, **sections), {}, "r.yaml")


def test_a_recipe_that_cannot_fit_stops_validate_and_train_in_one_line(tmp_path):
    # ZeRO-1 keeps all bf16 weights (13.5 GB) and fp32 gradients (27 GB) on every GPU, 1/4 of Adam's
    # 81 GB, beside the reference's full copy and 16 sequences' KV cache: about 78 GB of the 72 usable.
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_data(trainer={"output_dir": str(tmp_path / "runs")})))
    needles = ("r.yaml", "pool pool0 (actor, reference on 4 a100-80g)", "78.4 GB per GPU in generation",
               "actor 64.9, reference 13.5 GB", "72.0 GB usable of 80 GB", "set actor.zero_stage: 3")
    assert_one_line_error(run_hflow("validate", "--no-inputs", str(path)), *needles)
    assert_one_line_error(run_hflow("train", str(path)), *needles)
    assert not (tmp_path / "runs").exists()  # stopped before a run directory was made
    result = run_hflow("validate", "--no-inputs", str(path), "--set", "actor.zero_stage=3")
    assert result.returncode == 0 and result.stdout.startswith("ok: "), result.stderr


def test_the_fix_names_more_gpus_or_a_smaller_decode_batch_where_zero3_is_not_enough():
    one_gpu = _recipe(cluster={"gpus": 1})
    with pytest.raises(UserError, match=r"r.yaml: .*on 1 a100-80g.*set actor.zero_stage: 3, then use 2 GPUs for "
                                        r"pool pool0 \(cluster.gpus: 2\)"):
        check_runtime(one_gpu, "r.yaml")
    check_runtime(_recipe(cluster={"gpus": 2}, actor={"zero_stage": 3}), "r.yaml")
    # 1024 sequences over 4 GPUs decoded 128 at a time (0.5 MiB of KV cache per token), beside the
    # whole weights the ZeRO-3 rollout gathers (13.5 GB, whatever the count of GPUs); the reference
    # is partitioned like the actor (13.5 / 4 GB).
    big_batch = _recipe(actor={"zero_stage": 3}, rollout={"batch_size": 128, "n": 16}, trainer={"prompts_per_step": 64})
    with pytest.raises(UserError, match=r"needs about 74.8 GB .*reference 3.4 GB.* set rollout.batch_size: 64 or use "
                                        r"5 GPUs for pool pool0 \(cluster.gpus: 5\)"):
        check_runtime(big_batch, "r.yaml")
    check_runtime(_recipe(actor={"zero_stage": 3}, rollout={"batch_size": 64, "n": 16},
                          trainer={"prompts_per_step": 64}), "r.yaml")


def test_the_70b_recipe_is_an_auto_mapper_example_only():
    recipe, path = load_recipe("ppo/llama2-70b", ["actor.zero_stage=1"])
    # Below ZeRO-3 its reference and reward models are a full bf16 copy on every GPU: 138 GB, and 72 GB
    # are usable.
    with pytest.raises(UserError, match=rf"{path}: as hflow runs it, the reward and reference models are a full "
                                        r"copy on every GPU, about 139.7 and 140.7 GB .* 72.0 GB usable .* "
                                        r"auto-mapper example only"):
        check_runtime(recipe, str(path))
    # As shipped (ZeRO-3) they are partitioned, but the hf rollout gathers the actor's whole weights
    # (138 GB) on each GPU.
    recipe, path = load_recipe("ppo/llama2-70b")
    with pytest.raises(UserError, match=rf"{path}: as hflow runs it, under ZeRO-3 the hf engine gathers the actor's "
                                        r"whole weights on every GPU for the rollout \(1\d\d.\d GB\), more than the "
                                        r"72.0 GB usable .* rollout.engine: vllm .* auto-mapper example only"):
        check_runtime(recipe, str(path))


def test_validate_says_so_for_the_70b_recipe_at_zero_stage_1():
    result = run_hflow("validate", "--no-inputs", "ppo/llama2-70b", "--set", "actor.zero_stage=1")
    assert_one_line_error(result, "llama2-70b.yaml", "reward and reference models", "auto-mapper example only")


def test_the_34b_recipe_is_an_auto_mapper_example_only_with_the_hf_engine():
    recipe, path = load_recipe("ppo/codellama-34b")
    # Under ZeRO-3 its rollout gathers the whole 67.5 GB of bf16 weights on each GPU beside the rest.
    with pytest.raises(UserError, match=rf"{path}: as hflow runs it, pool train \(actor, critic on 24 a100-80g\) "
                                        r"needs about 126.8 GB .* whole weights .* \(67.5 GB\), and no pool of up "
                                        r"to 256 GPUs .* rollout.engine: vllm .* auto-mapper example only"):
        check_runtime(recipe, str(path))
    # The header's way to train it: vLLM splits the rollout's weights over 4 GPUs.
    vllm = ["rollout.engine=vllm", "rollout.tensor_parallel_size=4", "rollout.gpu_memory_utilization=0.35"]
    recipe, path = load_recipe("ppo/codellama-34b", vllm)
    check_memory(recipe, str(path))


def test_the_70b_recipe_fits_64_gpus_with_vllm_as_its_header_says():
    vllm = ["rollout.engine=vllm", "rollout.tensor_parallel_size=8", "rollout.gpu_memory_utilization=0.35",
            "placement.mode=colocate", "cluster.gpus=64"]
    recipe, path = load_recipe("ppo/llama2-70b", vllm)
    check_memory(recipe, str(path))


EIGHT_B_SCORERS = ["reward.model=meta-llama/Llama-3.1-8B", "cost.model=meta-llama/Llama-3.1-8B"]


@pytest.mark.parametrize("name, sets", [("ppo/llama2-7b", []), ("ppo/llama2-13b", []), ("ppo/qwen2.5-7b-hh", []),
                                        ("safe_rlhf/llama3.1-8b-pku", EIGHT_B_SCORERS)])
def test_the_large_recipes_fit_as_shipped_and_not_at_zero_stage_1(name, sets):
    recipe, path = load_recipe(name, sets)
    check_runtime(recipe, str(path))
    recipe, path = load_recipe(name, [*sets, "actor.zero_stage=1", "critic.zero_stage=1"])
    with pytest.raises(UserError, match=rf"{path}: as hflow runs it, pool .* more than the 72.0 GB usable"):
        check_runtime(recipe, str(path))


def test_long_prompts_are_not_refused_for_logits_the_head_never_computes():
    """Qwen2.5-7B (152k tokens) with 8,192-token prompts and 512-token responses: hflow's passes run
    the LM head on the 513 scored positions a row, not 8,704 (counted at every position, the
    training stage needed 91 GB a GPU of 72 usable; as run, 55 at its busiest stage, generation)."""
    recipe, path = load_recipe("ppo/qwen2.5-7b-hh", ["data.max_prompt_length=8192"])
    check_runtime(recipe, str(path))


def test_cpu_recipes_are_not_checked():
    tight = {"cluster": {"gpus": 1, "gpu": "a100-40g"}}
    with pytest.raises(UserError, match="36.0 GB usable"):
        check_runtime(_recipe(**tight), "r.yaml")
    check_runtime(_recipe(**tight, trainer={"device": "cpu"}), "r.yaml")  # a CPU run
    check_runtime(_recipe(cluster={"gpus": 1, "gpu": "auto"}), "r.yaml")  # no GPU named
    check_runtime(_recipe(cluster={"gpus": 1, "gpu": "auto"}, trainer={"device": "cuda"}), "r.yaml")  # none visible
    quickstart, path = load_recipe("grpo/quickstart")
    check_runtime(quickstart, str(path))


def test_trainer_device_cuda_checks_against_the_visible_gpu(monkeypatch):
    recipe = _recipe(cluster={"gpus": 1, "gpu": "auto"}, trainer={"device": "cuda"})
    monkeypatch.setattr("hflow.trainer.placement.memory_check.detect_gpu", lambda: "a100-40g")
    with pytest.raises(UserError, match="on 1 a100-40g"):
        check_runtime(recipe, "r.yaml")

    def unknown_gpu():
        raise UserError("GPU 'RTX 4090' is not in the mapper's catalog")

    monkeypatch.setattr("hflow.trainer.placement.memory_check.detect_gpu", unknown_gpu)
    check_runtime(recipe, "r.yaml")  # no figures to check against: skipped


def test_a_model_of_unknown_shape_counts_nothing():
    check_runtime(_recipe(model="acme/mystery-9b", cluster={"gpus": 1, "gpu": "a100-40g"}), "r.yaml")
    recipe = _recipe(algorithm="ppo", reward={"model": "acme/mystery-reward"}, cluster={"gpus": 1})
    workload = workload_from_recipe(recipe, roles=(*ROLES, "cost_critic"), known_only=True)
    assert set(workload.models) == {"actor", "reference"}  # the critic starts from the unknown reward model
    with pytest.raises(UserError, match="acme/mystery-reward"):
        workload_from_recipe(recipe)  # the mapper's search still needs every shape


def test_an_unknown_gpu_type_is_named():
    with pytest.raises(UserError, match=r"r.yaml: cluster.gpu: unknown GPU type 'a100'; accepted: a100-40g"):
        check_runtime(_recipe(cluster={"gpu": "a100"}), "r.yaml")


def test_only_the_roles_a_command_starts_count():
    recipe = _recipe(cluster={"gpus": 1}, actor={"zero_stage": 3})  # the actor alone: 108 GB of ZeRO-3 states
    with pytest.raises(UserError, match=r"pool pool0 \(actor, reference on 1"):
        check_runtime(recipe, "r.yaml")
    with pytest.raises(UserError, match=r"pool pool0 \(actor on 1"):
        check_runtime(recipe, "r.yaml", roles=["actor"])
    check_runtime(_recipe(model="acme/mystery-9b", cluster={"gpus": 1}), "r.yaml", roles=["actor", "reward"])
