"""Combinations the new algorithms (#15) do not define: one line naming the keys, exit 2."""

import pytest

from helpers import assert_one_line_error, assert_recipe_error, run_hflow
from hflow.trainer.config.load import load_recipe


def test_gspo_with_a_token_level_aggregation_is_a_one_line_error(tmp_path):
    # GSPO's loss is one term per sequence: a token-level aggregation is not GSPO.
    result = run_hflow("validate", "gspo/tiny", "--set", "gspo.loss_agg_mode=token-mean", cwd=tmp_path)
    assert_one_line_error(result, "gspo/tiny.yaml", "gspo.loss_agg_mode=token-mean", "seq-mean-token-mean")


@pytest.mark.parametrize("recipe, overrides, needles", [
    ("dapo/tiny", ["rollout.n=1", "trainer.prompts_per_step=32"],
     ["algorithm dapo with rollout.n=1", "dynamic sampling", "2 or more"]),
    ("dapo/tiny", ["dapo.overlong_buffer=10"], ["dapo.overlong_buffer=10", "rollout.max_response_length=10"]),
    ("rloo/tiny", ["rollout.n=1", "trainer.prompts_per_step=32"], ["algorithm rloo with rollout.n=1"]),
    ("reinforce_pp/tiny_baseline", ["rollout.n=1", "trainer.prompts_per_step=32"],
     ["algorithm reinforce_pp_baseline with rollout.n=1"]),
    ("grpo/quickstart", ["grpo.loss_agg_mode=sum"], ["grpo.loss_agg_mode", "seq-mean-token-sum-norm"]),
])
def test_undefined_algorithm_combinations_are_user_errors(recipe, overrides, needles):
    assert_recipe_error(recipe, overrides, needles)


def test_dapo_without_dynamic_sampling_accepts_one_sample_per_prompt():
    recipe, _ = load_recipe("dapo/tiny", ["rollout.n=1", "dapo.dynamic_sampling=false",
                                          "trainer.prompts_per_step=32"])
    assert recipe.loss_agg_mode == "token-mean" and recipe.clip == (0.2, 0.28)
    assert not recipe.uses_reference  # DAPO: no KL, no reference model


def test_new_algorithms_resolve_their_actor_loss():
    assert load_recipe("gspo/tiny")[0].policy_loss == "gspo"
    assert load_recipe("gspo/tiny")[0].loss_agg_mode == "seq-mean-token-mean"
    assert load_recipe("grpo/quickstart")[0].loss_agg_mode == "token-mean"  # the behaviour before #15
    assert load_recipe("reinforce_pp/tiny")[0].kl.in_reward
    assert not load_recipe("reinforce_pp/tiny_baseline")[0].kl.in_reward
