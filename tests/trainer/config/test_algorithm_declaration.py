"""An algorithm is declared once, beside its recipe section: the schema, the `algorithm` names,
the `hflow recipes keys` table and the registry all follow the declaration (no central list)."""

import subprocess
import sys
import textwrap

from hflow.trainer.config.algorithm_sections import ALGORITHMS, SECTIONS
from hflow.trainer.config.recipe import Recipe


def test_every_declared_algorithm_has_its_section_in_the_recipe():
    assert set(SECTIONS) == set(ALGORITHMS)
    for name, section in SECTIONS.items():
        assert Recipe.model_fields[name].annotation is section
        assert Recipe.model_fields[name].description == ALGORITHMS[name].description


def test_a_new_declaration_is_a_recipe_section_and_an_algorithm_name():
    """A section declared before the recipe is built (as every one in algorithm_sections.py is)
    becomes `<name>:` in the recipe, a value of `algorithm`, and a row with its roles."""
    script = textwrap.dedent("""
        from pydantic import Field
        from hflow.trainer.config import algorithm_sections as a

        @a.algorithm("toy", ("actor", "reward"), "A toy's knob.", program="grpo")
        class ToyConfig(a.ClipSection, a.KLSection):
            knob: int = Field(3, ge=0, description="A toy knob.")
            kl_in_reward: bool = Field(False, description="Charge the KL in the reward.")

            def check(self, recipe):
                a.needs_group(recipe, "the toy compares samples")

        from hflow.trainer.config.recipe import Recipe
        from hflow.trainer.config.keys import recipe_keys
        base = dict(model={"path": "m"}, data={"train": "synthetic:digits"}, algorithm="toy")
        recipe = Recipe(**base, toy={"knob": 5})
        assert recipe.toy.knob == 5 and recipe.algorithm_spec.roles == ("actor", "reward")
        assert recipe.kl.coef == 0.01 and recipe.algorithm_spec.program == "hflow.trainer.algorithms.grpo"
        keys = {k.key: k for k in recipe_keys()}
        assert keys["toy.knob"].read_by == "toy" and keys["toy.knob"].default == "3"
        try:
            Recipe(**base, rollout={"n": 1})
        except ValueError as err:
            assert "algorithm toy with rollout.n=1: the toy compares samples" in str(err), err
        else:
            raise AssertionError("rollout.n=1 was accepted")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
