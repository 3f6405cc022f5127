"""Placement: pool sizes and each role's pool for every mode, the errors a user can act on,
the device count, and the plan.json of a local run."""

import pytest
import torch

from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.placement.worker_groups import build_worker_groups, device_count, pool_layout

ROLES = ["actor", "reference", "reward", "critic"]


def _recipe(placement=None, cluster=None):
    return build_recipe({
        "algorithm": "ppo",
        "model": {"path": "unused-model"},  # nothing here loads it
        "data": {"train": "synthetic:digits"},
        "placement": placement or {}, "cluster": cluster or {},
    }, {}, "test")


def test_colocate_puts_every_role_on_one_pool_of_every_device():
    layout = pool_layout(_recipe({"mode": "colocate"}), ROLES, 3)
    assert layout.sizes == {"pool0": 3}
    assert layout.role_pool == {r: "pool0" for r in ROLES}
    assert layout.mapper_plan is None


@pytest.mark.parametrize("devices, actor, rest", [(2, 1, 1), (5, 3, 2), (8, 4, 4)])
def test_split_gives_the_actor_the_larger_half(devices, actor, rest):
    layout = pool_layout(_recipe({"mode": "split"}), ROLES, devices)
    assert layout.sizes == {"actor": actor, "rest": rest}
    assert layout.role_pool == {"actor": "actor", "reference": "rest", "reward": "rest", "critic": "rest"}


def test_standalone_gives_each_role_an_equal_share():
    layout = pool_layout(_recipe({"mode": "standalone"}), ROLES, 9)  # 9 // 4 = 2 each, one left idle
    assert layout.sizes == {"actor": 2, "reference": 2, "reward": 2, "critic": 2}
    assert layout.role_pool == {r: r for r in ROLES}


def test_explicit_uses_only_the_pools_the_run_maps_roles_to():
    recipe = _recipe({"mode": "explicit", "pools": {"gen": 2, "score": 1, "spare": 4},
                      "roles": {"actor": "gen", "reference": "score", "reward": "score", "critic": "gen"}})
    layout = pool_layout(recipe, ROLES, 99)  # explicit sizes are taken as given
    assert layout.sizes == {"gen": 2, "score": 1}
    assert layout.role_pool == {"actor": "gen", "reference": "score", "reward": "score", "critic": "gen"}


@pytest.mark.parametrize("mode, devices, needles", [
    ("split", 1, ["placement.mode split needs at least 2 devices", "has 1"]),
    ("standalone", 3, ["standalone needs a device per role (4: actor, reference, reward, critic)", "has 3"]),
])
def test_too_few_devices_is_a_user_error(mode, devices, needles):
    with pytest.raises(UserError) as err:
        pool_layout(_recipe({"mode": mode}), ROLES, devices)
    for needle in needles:
        assert needle in str(err.value)


def test_explicit_role_without_a_pool_is_named():
    recipe = _recipe({"mode": "explicit", "pools": {"a": 1, "b": 1}, "roles": {"actor": "a", "reward": "b"}})
    with pytest.raises(UserError, match=r"placement.roles: no pool for reference, critic; .*"
                                        r"\(actor, reference, reward, critic\) to one of: a, b"):
        pool_layout(recipe, ROLES, 2)


def test_explicit_unknown_pool_is_named():
    recipe = _recipe({"mode": "explicit", "pools": {"a": 1},
                      "roles": {"actor": "a", "reference": "a", "reward": "nowhere", "critic": "a"}})
    with pytest.raises(UserError, match=r"placement.roles.reward: pool 'nowhere' is not in placement.pools \(a\)"):
        pool_layout(recipe, ROLES, 1)


def test_explicit_empty_pool_is_a_user_error():
    recipe = _recipe({"mode": "explicit", "pools": {"a": 0}, "roles": {"reward": "a"}})
    with pytest.raises(UserError, match="placement.pools.a: 0 devices; a pool needs at least 1"):
        pool_layout(recipe, ["reward"], 1)


def test_device_count_on_cpu_is_the_cpu_slots():
    assert device_count(_recipe(cluster={"cpu_slots": 3}), torch.device("cpu")) == 3
    assert device_count(_recipe(), torch.device("cpu")) == 1


def test_device_count_on_cuda_checks_the_visible_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_count(_recipe(), torch.device("cuda")) == 2  # gpus 0: every visible one
    assert device_count(_recipe(cluster={"gpus": 1}), torch.device("cuda")) == 1
    with pytest.raises(UserError, match="cluster.gpus=4 but only 2 GPUs are visible"):
        device_count(_recipe(cluster={"gpus": 4}), torch.device("cuda"))


def test_local_plan_records_one_pool_with_every_role():
    # The reward worker with a built-in function loads nothing until init_model, so this is cheap.
    groups = build_worker_groups(_recipe({"backend": "local"}), ["reward"], torch.device("cpu"))
    assert groups.plan() == {
        "backend": "local",
        "pools": [{"name": "pool0", "devices": ["cpu"], "roles": ["reward"]}],
        "roles": {"reward": {"pool": "pool0", "ranks": [0]}},
    }
    assert groups["reward"].world_size == 1 and groups.get("critic") is None


def test_local_backend_refuses_more_than_one_device():
    with pytest.raises(UserError, match=r"placement.backend local runs one colocated device; .*'actor': 1, 'rest': 1"):
        build_worker_groups(_recipe({"backend": "local", "mode": "split"}, {"cpu_slots": 2}), ["reward"],
                            torch.device("cpu"))
