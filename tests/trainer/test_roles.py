import typing

import pytest

from hflow.trainer.algorithms.registry import trainer_for
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.algorithm_sections import ALGORITHMS


def test_the_table_names_every_algorithm_the_schema_accepts():
    assert typing.get_args(Recipe.model_fields["algorithm"].annotation) == tuple(ALGORITHMS)
    for spec in ALGORITHMS.values():
        assert callable(trainer_for(spec.name))
        assert spec.settings in Recipe.model_fields
        assert all(section in Recipe.model_fields for section in spec.trained)


@pytest.mark.parametrize("algorithm,roles", [
    ("grpo", ["actor", "reference"]),
    ("ppo", ["actor", "reference", "critic"]),
    ("remax", ["actor", "reference"]),
    ("safe_rlhf", ["actor", "reference", "critic", "cost_critic"]),
])
def test_role_models_follow_the_table(algorithm, roles):
    recipe = Recipe(algorithm=algorithm, model={"path": "m"}, data={"train": "synthetic:digits"},
                    cost={"function": "synthetic_cost"})
    assert list(recipe.role_models()) == roles
    recipe.grpo.kl_coef = recipe.ppo.kl_coef = recipe.remax.kl_coef = 0
    assert list(recipe.role_models()) == [r for r in roles if r != "reference"]


def test_grpo_accepts_every_kl_estimator():
    for estimator in ("k1", "k2", "k3", "abs"):
        assert Recipe(model={"path": "m"}, data={"train": "x.jsonl"}, grpo={"kl_estimator": estimator}).kl.estimator \
            == estimator


def test_each_role_model_names_the_key_it_comes_from():
    recipe = Recipe(algorithm="safe_rlhf", model={"path": "m"}, data={"train": "synthetic:digits"},
                    reward={"model": "rm"}, cost={"model": "cm"})
    assert recipe.role_model_keys() == {
        "actor": ("model.path", "m"), "reference": ("model.path", "m"), "critic": ("reward.model", "rm"),
        "reward": ("reward.model", "rm"), "cost_critic": ("cost.model", "cm"), "cost": ("cost.model", "cm")}
    recipe.critic.path, recipe.cost.model, recipe.cost.function = "c", None, "synthetic_cost"
    assert recipe.role_model_keys()["cost_critic"] == ("critic.path", "c")  # falls back to the critic's
    assert recipe.critic_source == "c" and recipe.cost_critic_source == "c" and "cost" not in recipe.role_models()
