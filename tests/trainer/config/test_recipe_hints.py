"""What a recipe mistake is answered with (issue #32, item 6): another framework's name gets
hflow's key, a section given a value gets the key it probably meant, and every mistake of the
recipe comes in the one line, not one per run."""

import pytest

from helpers import assert_recipe_error
from hflow.trainer.config.other_names import OTHER_NAMES


@pytest.mark.parametrize("given, needles", [
    ("rollout.max_new_tokens=8", ["'max_new_tokens' is transformers' name", "'rollout.max_response_length'"]),
    ("grpo.beta=0.1", ["'beta' is TRL's name", "hflow's key is 'grpo.kl_coef'"]),
    ("trainer.num_generations=8", ["TRL's name", "'rollout.n'"]),
    ("actor.ppo_mini_batch_size=4", ["verl's name", "'actor.mini_batch_size'", "verl counts prompts"]),
    ("eval.per_device_eval_batch_size=64", ["TRL's name", "'eval.batch_size'", "evaluation's decoding batch"]),
    ("rollout.max_respons_length=8", ["did you mean 'max_response_length'?"]),  # a typo: the close match
])
def test_an_unknown_key_gets_the_hflow_key(given, needles):
    assert_recipe_error("grpo/quickstart", [given], ["unknown key", *needles])


def test_the_algorithm_section_in_the_hint_is_the_recipes():
    assert_recipe_error("grpo/quickstart", ["algorithm=dapo", "dapo.beta=0"], ["hflow's key is 'dapo.kl_coef'"])


def test_a_section_given_a_value():
    assert_recipe_error("grpo/quickstart", ["model=/models/mine"],
                        ["'model' is a section of keys (path, init", "did you mean 'model.path: /models/mine'?"])


def test_every_mistake_in_one_line():
    assert_recipe_error("grpo/quickstart", ["rollout.max_new_tokens=8", "actor.learning_rate=1e-4",
                                            "trainer.max_steps=3"],
                        ["'rollout.max_response_length'", "and 2 more:", "'actor.lr'", "'trainer.total_steps'"])


def test_every_hint_names_a_key_that_exists():
    from hflow.trainer.config.recipe import Recipe

    for name, (key, *_) in OTHER_NAMES.items():
        first = key.split(" ")[0].replace("<algorithm>", "grpo")
        section, _, field = first.partition(".")
        assert section in Recipe.model_fields, name
        if field:
            assert field in Recipe.model_fields[section].annotation.model_fields, name
