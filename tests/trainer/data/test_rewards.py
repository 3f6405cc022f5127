"""Built-in reward and cost functions, and the loader's errors."""

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.config.sections import RewardConfig
from hflow.trainer.data.rewards import BUILTINS, exact_match, load_reward_fn, synthetic_cost


def test_format_reward_uses_the_recipe_pattern():
    fn = load_reward_fn("format", cfg=RewardConfig(format_pattern=r"^<a>.*</a>$"))
    assert fn(["p", "p", "p"], ["<a>x</a>", "<a>x", "x<a>y</a>"]) == [1.0, 0.0, 0.0]
    gsm8k = load_reward_fn("format")  # default: a GSM8K-style final answer at the end
    assert gsm8k(["p", "p"], ["so #### 42", "42"]) == [1.0, 0.0]


def test_length_reward():
    fn = load_reward_fn("length", cfg=RewardConfig(target_length=4))
    # max(0, 1 - |n - 4| / 4) for n = 4, 2, 6, 9
    assert fn(["p"] * 4, ["abcd", "ab", "abcdef", "abcdefghi"]) == pytest.approx([1.0, 0.5, 0.5, 0.0])


def test_synthetic_cost_counts_high_digits_in_the_first_eight_characters():
    assert synthetic_cost(["p"] * 3, ["56789xyz", "01234abc", "5a6b0000999"]) == pytest.approx([5 / 8, 0.0, 2 / 8])


def test_exact_match_unchanged():
    assert exact_match(["q"], ["the answer is 1,000."], answer=["#### 1000"]) == [1.0]


def test_loader_errors_name_the_key():
    with pytest.raises(UserError, match="cost.function 'nope'"):
        load_reward_fn("nope", "cost.function")
    with pytest.raises(UserError, match="reward.format_pattern"):
        load_reward_fn("format", cfg=RewardConfig(format_pattern="(unclosed"))


def test_grpo_scale_by_std_from_the_recipe():
    """Dr. GRPO (`grpo.scale_by_std: false`) reaches the controller's advantage."""
    from hflow.trainer.algorithms.grpo import compute_advantages

    batch = Batch({"scores": torch.tensor([1.0, 0.0, 0.5, 0.5])}, {"uid": [0, 0, 1, 1]})
    base = {"model": {"path": "x"}, "data": {"train": "synthetic:digits"}}
    scaled = compute_advantages(batch, Recipe(**base, grpo={"eps": 1e-9}))["advantages"]
    dr = compute_advantages(batch, Recipe(**base, grpo={"scale_by_std": False}))["advantages"]
    assert scaled.tolist() == pytest.approx([0.5 / 0.5**0.5, -0.5 / 0.5**0.5, 0.0, 0.0], rel=1e-6)
    assert dr.tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])


@pytest.mark.parametrize("source, raised", [
    ("def fn(prompts, responses:\n    return []\n", "SyntaxError: "),
    ("raise RuntimeError('no API key set')\n", "RuntimeError: no API key set"),
])
def test_a_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch, source, raised):
    (tmp_path / "broken_reward_mod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError) as err:
        load_reward_fn("broken_reward_mod:fn", "cost.function")
    line = str(err.value)
    assert line.startswith("cost.function 'broken_reward_mod:fn': importing module 'broken_reward_mod' raised " + raised)
    assert "\n" not in line


def test_the_schema_accepts_exactly_the_built_in_rewards():
    """The recipe schema checks names against `reward_defaults.BUILTIN_NAMES` (it may not import
    the data layer); the functions live in `rewards.BUILTINS`: the two lists must agree."""
    from hflow.trainer.reward_defaults import BUILTIN_NAMES

    assert tuple(BUILTINS) == BUILTIN_NAMES
