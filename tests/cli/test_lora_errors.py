"""Wrong LoRA settings stop `hflow validate` / `hflow train` with one line and exit 2, before any
worker starts: a rank, alpha or dropout out of range, a target module the model lacks."""

import pytest
import yaml

from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from helpers import assert_one_line_error, run_hflow, write_recipe


@pytest.mark.parametrize("key, value, needle", [
    ("rank", 0, "greater than 0"), ("rank", -4, "greater than 0"), ("alpha", 0, "greater than 0"),
    ("dropout", 1.0, "less than 1"), ("dropout", -0.1, "greater than or equal to 0"),
    ("target_modules", [], "at least one module"),
])
def test_a_value_out_of_range_is_one_line(tmp_path, tiny_model, key, value, needle):
    data = yaml.safe_load(write_recipe(tmp_path / "r.yaml", tiny_model).read_text())
    with pytest.raises(UserError) as err:
        build_recipe(data, {"actor": {"lora": {key: value}}}, "r.yaml")
    assert f"(--set actor.lora.{key})" in str(err.value) and needle in str(err.value)


def test_lora_rank_0_through_the_cli(tmp_path, tiny_model):
    result = run_hflow("validate", str(write_recipe(tmp_path / "r.yaml", tiny_model)), "--set", "actor.lora.rank=0")
    assert_one_line_error(result, "actor.lora.rank", "bad value 0", "greater than 0")


def test_a_target_module_the_model_lacks_names_those_it_has(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model,
                          actor={"lora": {"rank": 4, "target_modules": ["q_proj", "c_attn"]}})
    result = run_hflow("train", str(recipe))
    assert_one_line_error(result, "actor.lora.target_modules", "'c_attn'", "its linear layers:", "q_proj",
                          "down_proj")
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_the_critic_has_its_own_lora_key(tmp_path, tiny_model):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_model, algorithm="ppo",
                          critic={"lora": {"rank": 4, "target_modules": ["lm_head"]}})
    assert_one_line_error(run_hflow("validate", str(recipe)), "critic.lora.target_modules", "'lm_head'")
