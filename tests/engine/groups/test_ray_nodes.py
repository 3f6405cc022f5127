"""Where a run's ranks go on a Ray cluster of several nodes, and the line for a lost node (no Ray needed)."""

import pytest

from hflow.engine.groups.ray_nodes import Node, alive_nodes, lay_out, lost_line
from hflow.errors import UserError


def _ray_node(node_id, ip, cpus, gpus=0, alive=True):
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive,
            "Resources": {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}}


def test_the_drivers_node_comes_first_then_the_others_by_address():
    nodes = [_ray_node("c", "10.0.0.3", 8, 4), _ray_node("a", "10.0.0.9", 8, 4), _ray_node("b", "10.0.0.2", 8, 4),
             _ray_node("d", "10.0.0.1", 8, 4, alive=False), _ray_node("e", "10.0.0.4", 8)]
    assert [n.id for n in alive_nodes(nodes, here="a", use_gpu=True)] == ["a", "b", "c"]  # e has no GPU, d is dead
    assert [(n.id, n.slots) for n in alive_nodes(nodes, here="a", use_gpu=False)] == \
        [("a", 8), ("b", 8), ("c", 8), ("e", 8)]


def _ids(placed):
    return {pool: [n.id for n in on] for pool, on in placed.items()}


def test_a_pool_goes_whole_on_the_first_node_with_room_and_spans_only_when_none_has():
    eight = [Node("a", "10.0.0.1", 8), Node("b", "10.0.0.2", 8)]
    # 4, then 8, then 4 on two nodes of 8: the second 4 goes beside the first, nothing straddles.
    assert _ids(lay_out([("actor", 4), ("rollout", 8), ("reward", 4)], eight, use_gpu=True)) == \
        {"actor": ["a"] * 4, "rollout": ["b"] * 8, "reward": ["a"] * 4}
    # data parallelism over more devices than a node has: whole nodes, in order
    assert _ids(lay_out([("actor", 12), ("rest", 4)], eight, use_gpu=True)) == \
        {"actor": ["a"] * 8 + ["b"] * 4, "rest": ["b"] * 4}
    nodes = [Node("a", "10.0.0.1", 2), Node("b", "10.0.0.2", 2), Node("c", "10.0.0.3", 4)]
    assert _ids(lay_out([("actor", 2), ("rest", 3), ("reward", 1)], nodes, use_gpu=True)) == \
        {"actor": ["a", "a"], "rest": ["c", "c", "c"], "reward": ["b"]}
    # two slots left on different nodes, a pool of two: it spans them (first the node that is left whole)
    assert _ids(lay_out([("x", 3), ("y", 3), ("z", 2)], [Node("a", "1", 4), Node("b", "2", 4)], use_gpu=True)) == \
        {"x": ["a"] * 3, "y": ["b"] * 3, "z": ["a", "b"]}


def test_more_devices_than_the_cluster_has_is_one_line_naming_both():
    with pytest.raises(UserError) as err:
        lay_out([("actor", 2), ("rest", 2)], [Node("a", "127.0.0.1", 1), Node("b", "127.0.0.2", 2)], use_gpu=False)
    assert str(err.value).startswith("the run's pools need 4 CPU slots (actor 2, rest 2) and the Ray cluster's "
                                     "alive nodes have 3 (127.0.0.1 1, 127.0.0.2 2)")


def test_a_lost_node_is_named_with_the_roles_it_carried():
    ranks = [{"node_id": "aaaa1111", "node": "10.0.0.1", "pool": "actor", "rank": 0, "roles": ["actor"]},
             {"node_id": "bbbb2222cccc", "node": "10.0.0.2", "pool": "actor", "rank": 1, "roles": ["actor"]},
             {"node_id": "bbbb2222cccc", "node": "10.0.0.2", "pool": "rest", "rank": 0, "roles": ["reference", "reward"]}]
    line = lost_line({"bbbb2222cccc", "other"}, ranks)
    assert line.startswith("the Ray cluster lost a node during the run: node 10.0.0.2 (Ray node bbbb2222) carried "
                           "actor rank 1, reference rank 0, reward rank 0; ")
    assert "--resume" in line and "\n" not in line
    assert lost_line({"other"}, ranks) is None
