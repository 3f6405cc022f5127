"""The KL to the reference charged in the reward, as each algorithm program does it
(`engine/rlmath/kl.py: kl_in_reward`, one function), hand-computed."""

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.trainer.algorithms import grpo, ppo, reinforce_pp, remax
from hflow.trainer.algorithms.safe_rlhf import compute_advantages as safe_rlhf_advantages
from hflow.trainer.config.recipe import Recipe

# k1 per token: ref - old negated = 0.5, -1.0; the third column is padding.
MASK = torch.tensor([[1, 1, 0]])
OLD = torch.tensor([[-1.0, -2.0, 0.0]])
REF = torch.tensor([[-1.5, -1.0, 0.0]])


def _recipe(algorithm, **section):
    key = {"reinforce_pp": "reinforce_pp", "safe_rlhf": "ppo"}.get(algorithm, algorithm)
    extra = {"cost": {"function": "synthetic_cost"}} if algorithm == "safe_rlhf" else {}
    return Recipe(model={"path": "x"}, data={"train": "synthetic:digits"}, algorithm=algorithm,
                  **{key: {"kl_estimator": "k1", **section}}, **extra)


def _batch(ref=True, **more):
    cols = {"response_mask": MASK, "old_log_probs": OLD, "scores": torch.tensor([1.0]), **more}
    if ref:
        cols["ref_log_probs"] = REF
    return Batch(cols, {"uid": ["a"]})


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_outcome_algorithms_charge_the_summed_kl_to_the_score(algorithm):
    charged = grpo.kl_charged_scores(_batch(), _recipe(algorithm, kl_coef=0.2, kl_in_reward=True))
    assert charged.tolist() == pytest.approx([1.0 - 0.2 * (0.5 - 1.0)])
    # in the loss instead, or no reference: the score as it is
    assert grpo.kl_charged_scores(_batch(), _recipe(algorithm, kl_coef=0.2, kl_in_reward=False)).tolist() == [1.0]
    assert grpo.kl_charged_scores(_batch(ref=False), _recipe(algorithm, kl_coef=0.2)).tolist() == [1.0]


def test_token_algorithms_charge_the_kl_on_every_response_token():
    expected = [-0.2 * 0.5, -0.2 * -1.0 + 1.0, 0.0]
    recipe = _recipe("ppo", kl_coef=0.2)
    out = ppo.compute_advantages(_batch(values=torch.zeros(1, 3)), recipe, kl_coef=0.2)
    assert out["token_rewards"][0].tolist() == pytest.approx(expected)
    out = reinforce_pp.compute_advantages(_batch(), _recipe("reinforce_pp", kl_coef=0.2))
    assert out["token_rewards"][0].tolist() == pytest.approx(expected)
    out = remax.compute_advantages(_batch(), torch.tensor([0.0]), _recipe("remax", kl_coef=0.2))
    assert out["token_rewards"][0].tolist() == pytest.approx(expected)
    out = remax.compute_advantages(_batch(), torch.tensor([0.0]), _recipe("remax", kl_coef=0.2, kl_in_reward=False))
    assert out["token_rewards"][0].tolist() == pytest.approx([0.0, 1.0, 0.0])
    out = ppo.compute_advantages(_batch(ref=False, values=torch.zeros(1, 3)), recipe, kl_coef=0.2)
    assert out["token_rewards"][0].tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_kl_is_split_between_reward_and_cost():
    recipe = Recipe(model={"path": "x"}, data={"train": "synthetic:digits"}, algorithm="safe_rlhf",
                    cost={"function": "synthetic_cost"},
                    ppo={"kl_coef": 0.2, "kl_estimator": "k1", "whiten_advantages": False, "gamma": 1.0, "lam": 1.0})
    batch = Batch({
        "response_mask": torch.tensor([[1, 1, 0]]),
        "old_log_probs": torch.tensor([[-1.0, -2.0, 0.0]]),
        "ref_log_probs": torch.tensor([[-1.5, -1.0, 0.0]]),  # k1 per token: 0.5, -1.0
        "scores": torch.tensor([1.0]), "costs": torch.tensor([2.0]),
        "values": torch.zeros(1, 3), "cost_values": torch.zeros(1, 3),
    })
    out = safe_rlhf_advantages(batch, recipe, kl_coef=0.2, multiplier=1.0)
    # reward tokens: -0.5 * 0.2 * kl (+ score last); cost tokens: +0.5 * 0.2 * kl (+ cost last)
    assert out["token_rewards"][0].tolist() == pytest.approx([-0.05, 0.1 + 1.0, 0.0])
    assert out["token_costs"][0].tolist() == pytest.approx([0.05, -0.1 + 2.0, 0.0])
    # gamma = lam = 1, zero values: advantages are the rewards-to-go; combined with lambda = 1
    a_r, a_c = torch.tensor([1.05, 1.1]), torch.tensor([1.95, 1.9])
    assert out["advantages"][0, :2].tolist() == pytest.approx(((a_r - a_c) / 2).tolist())
    assert out["returns"][0].tolist() == pytest.approx([1.05, 1.1, 0.0])
    assert out["cost_returns"][0].tolist() == pytest.approx([1.95, 1.9, 0.0])
