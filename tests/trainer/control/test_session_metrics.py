"""The session's module-level helpers: a step's rollout statistics and samples from a
hand-built batch, against values worked out by hand, and the divisibility checks that stop a
run whose batches cannot be split over its ranks."""

import json
import math

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import ResourcePool, WorkerGroup
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.placement.worker_groups import WorkerGroups
from hflow.trainer.control.session import _check_divisible, rollout_metrics, samples


def _recipe(algorithm="ppo", **sections):
    return build_recipe({"algorithm": algorithm, "model": {"path": "unused"},
                         "data": {"train": "synthetic:digits"}, **sections}, {}, "test")


MASK = [[1, 1, 0], [1, 0, 0], [1, 1, 1]]  # response lengths 2, 1, 3


def _rollout(**extra) -> Batch:
    return Batch({
        "scores": torch.tensor([1.0, 2.0, 6.0]),
        "response_mask": torch.tensor(MASK),
        # masked entries 0.5 + 1.5 + 2 + 1 + 1 + 1 = 7 over 6 tokens; the 9s are padding
        "entropy": torch.tensor([[0.5, 1.5, 9.0], [2.0, 9.0, 9.0], [1.0, 1.0, 1.0]]),
        **extra,
    })


def test_reward_length_and_entropy_statistics():
    metrics = rollout_metrics(_rollout(), _recipe())
    assert metrics == pytest.approx({
        "reward/mean": 3.0,  # (1 + 2 + 6) / 3
        "reward/std": math.sqrt(7.0),  # unbiased: (4 + 1 + 9) / 2
        "reward/min": 1.0, "reward/max": 6.0,
        "response_length/mean": 2.0, "response_length/max": 3.0,
        "entropy/mean": 7 / 6,
    })  # no reference, no costs: no kl/ or cost/ keys


def test_kl_uses_the_algorithms_estimator_over_response_tokens():
    old = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    # PPO's k1 is old - ref per token: 0.5, -0.5 | -1 | 0, 1, 2 -> 2 / 6 (padding's 99s ignored)
    ref = torch.tensor([[-1.5, -0.5, 99.0], [-1.0, 99.0, 99.0], [-1.0, -2.0, -3.0]])
    k1 = rollout_metrics(_rollout(old_log_probs=old, ref_log_probs=ref), _recipe("ppo"))
    assert k1["kl/mean"] == pytest.approx(1 / 3)
    # GRPO's k3 is exp(d) - d - 1 with d = ref - old = ln 2 on every token: 1 - ln 2
    ref = old + math.log(2.0)
    k3 = rollout_metrics(_rollout(old_log_probs=old, ref_log_probs=ref), _recipe("grpo"))
    assert k3["kl/mean"] == pytest.approx(1 - math.log(2.0))


def test_cost_statistics_when_the_batch_has_costs():
    metrics = rollout_metrics(_rollout(costs=torch.tensor([0.0, 3.0, -3.0])), _recipe())
    assert metrics["cost/mean"] == pytest.approx(0.0)
    assert metrics["cost/max"] == pytest.approx(3.0)
    assert metrics["cost/std"] == pytest.approx(3.0)  # (0 + 9 + 9) / 2 = 9


def test_one_row_has_zero_spread():
    one = Batch({"scores": torch.tensor([4.0]), "response_mask": torch.tensor([[1, 1]]),
                 "entropy": torch.tensor([[1.0, 3.0]]), "costs": torch.tensor([2.0])})
    metrics = rollout_metrics(one, _recipe())
    assert metrics["reward/std"] == 0.0 and metrics["cost/std"] == 0.0
    assert metrics["entropy/mean"] == pytest.approx(2.0)


def _responses(n, costs=False) -> Batch:
    tensors = {"scores": torch.arange(n, dtype=torch.float) / 2}
    if costs:
        tensors["costs"] = -torch.arange(n, dtype=torch.float)
    prompts = [f"p{i}" for i in range(n)]
    prompts[3 % n] = [{"role": "user", "content": "hi"}]  # a chat prompt is logged as JSON
    return Batch(tensors, {"prompt": prompts, "response_text": [f"r{i}" for i in range(n)]})


@pytest.mark.parametrize("n, count, rows", [
    (6, 2, [0, 3]),  # every 6 // 2 = 3rd row
    (5, 2, [0, 2]),  # every 2nd of 0, 2, 4, the first 2
    (6, 4, [0, 1, 2, 3]),  # stride 1
    (2, 5, [0, 1]),  # fewer rows than asked: all of them
    (6, 0, []),
])
def test_samples_spread_over_the_batch(n, count, rows):
    got = samples(_responses(n), step=7, count=count)
    assert [s["response"] for s in got] == [f"r{i}" for i in rows]
    assert [s["reward"] for s in got] == [i / 2 for i in rows]
    assert all(s["step"] == 7 and set(s) == {"step", "prompt", "response", "reward"} for s in got)


def test_samples_log_chat_prompts_as_json_and_costs_when_present():
    got = samples(_responses(6, costs=True), step=1, count=6)
    assert got[3] == {"step": 1, "prompt": json.dumps([{"role": "user", "content": "hi"}]),
                      "response": "r3", "reward": 1.5, "cost": -3.0}
    assert got[0]["prompt"] == "p0"


def _groups(**worlds) -> WorkerGroups:
    groups = {role: WorkerGroup(role, ResourcePool(role, [f"cpu:{i}" for i in range(n)]), object)
              for role, n in worlds.items()}
    return WorkerGroups("ray", [g.pool for g in groups.values()], groups)


def test_divisible_batches_pass():
    recipe = _recipe(trainer={"prompts_per_step": 8}, rollout={"n": 2},
                     actor={"mini_batch_size": 8, "micro_batch_size": 4})
    _check_divisible(recipe, _groups(actor=4, reference=2, critic=8))  # 8 and 16 split over each


@pytest.mark.parametrize("sections, worlds, message", [
    ({"trainer": {"prompts_per_step": 6}}, {"actor": 4},
     "trainer.prompts_per_step=6 does not split evenly over the 4 ranks of the actor group; use a multiple of 4"),
    ({"trainer": {"prompts_per_step": 4}, "rollout": {"n": 4},
      "actor": {"mini_batch_size": 2, "micro_batch_size": 2}}, {"actor": 4},
     "actor.mini_batch_size=2 does not split evenly over the 4 ranks of the actor group"),
    ({"trainer": {"prompts_per_step": 6}, "rollout": {"n": 1}, "actor": {"micro_batch_size": 3},
      "critic": {"mini_batch_size": 2, "micro_batch_size": 1}}, {"actor": 3, "critic": 3},
     "critic.mini_batch_size=2 does not split evenly over the 3 ranks of the critic group"),
    ({"trainer": {"prompts_per_step": 4}, "rollout": {"engine": "vllm", "tensor_parallel_size": 3}},
     {"actor": 4}, "rollout.tensor_parallel_size=3 does not divide the 4 ranks of the actor group"),
])
def test_indivisible_batches_are_named(sections, worlds, message):
    with pytest.raises(UserError) as err:
        _check_divisible(_recipe(**sections), _groups(**worlds))
    assert message in str(err.value)


def test_critic_mini_batch_is_checked_only_on_critics():
    recipe = _recipe(trainer={"prompts_per_step": 6}, rollout={"n": 1}, actor={"micro_batch_size": 3},
                     critic={"mini_batch_size": 2, "micro_batch_size": 1})
    _check_divisible(recipe, _groups(actor=3, reference=3))  # no critic group: its 2 is not split
