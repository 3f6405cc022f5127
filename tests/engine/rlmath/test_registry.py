"""Every name the RL math answers to is one registry entry: the recipe accepts exactly the
registered names, and a name nobody registered is one error listing those that are."""

import pytest
import torch
from pydantic import ValidationError

from hflow.engine.rlmath.advantages import ADVANTAGE_ESTIMATORS
from hflow.engine.rlmath.aggregation import AGGREGATIONS, aggregate
from hflow.engine.rlmath.kl import KL_ESTIMATORS, kl_estimate
from hflow.engine.rlmath.off_policy import OFF_POLICY_CORRECTIONS, capped_weights
from hflow.engine.rlmath.policy_losses import POLICY_LOSSES
from hflow.engine.rlmath.registry import Registry
from hflow.trainer.config.recipe import Recipe


def test_a_registry_keeps_order_refuses_twice_and_names_the_known_on_a_miss():
    table = Registry("widget")
    table.register("b")(abs)
    table.add("a", round)
    assert table.names() == ("b", "a") and "a" in table and len(table) == 2
    assert table.get("a") is round
    with pytest.raises(ValueError, match="widget 'a' is registered twice"):
        table.add("a", min)
    with pytest.raises(ValueError, match="unknown widget 'c'; accepted: b, a"):
        table.get("c")


def test_the_catalogue_of_each_kind():
    assert ADVANTAGE_ESTIMATORS.names() == ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae", "remax")
    assert AGGREGATIONS.names() == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                    "seq-mean-token-sum-norm")
    assert KL_ESTIMATORS.names() == ("k1", "k2", "k3", "abs")
    assert OFF_POLICY_CORRECTIONS.names() == ("none", "tis", "decoupled")


def test_unknown_names_are_refused_by_the_math_and_by_the_recipe():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'; accepted: token-mean, "):
        aggregate(x, x, "mean")
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; accepted: k1, k2, k3, abs"):
        kl_estimate(x, x, "k4")
    with pytest.raises(ValueError, match="unknown off-policy correction 'is'; accepted: none, tis, decoupled"):
        capped_weights(x, 2.0, "is")
    base = {"model": {"path": "x"}, "data": {"train": "synthetic:digits"}}
    for section, key, bad, registry in [("grpo", "policy_loss", "dpo", POLICY_LOSSES),
                                        ("grpo", "kl_estimator", "k4", KL_ESTIMATORS),
                                        ("grpo", "loss_agg_mode", "mean", AGGREGATIONS),
                                        ("actor", "off_policy_correction", "is", OFF_POLICY_CORRECTIONS)]:
        with pytest.raises(ValidationError, match=key):
            Recipe(**base, **{section: {key: bad}})
        field = Recipe.model_fields[section].annotation.model_fields[key]
        assert field.annotation.__args__ == registry.names()
