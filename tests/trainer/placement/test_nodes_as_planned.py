"""placement: auto on a Ray cluster runs as the auto-mapper planned it: a pool it sized for one node
of `cluster.gpus_per_node` devices is not spread over two (no Ray needed)."""

import pytest

from hflow.engine.groups.ray_nodes import Node, lay_out
from hflow.errors import UserError
from hflow.trainer.placement.worker_groups import check_nodes_as_planned


def test_pools_of_a_node_or_whole_nodes_on_nodes_of_that_size_run_as_planned():
    eight = [Node("a", "10.0.0.1", 8), Node("b", "10.0.0.2", 8)]
    check_nodes_as_planned(lay_out([("actor", 8), ("rollout", 4), ("reward", 4)], eight, use_gpu=True), 8)
    check_nodes_as_planned(lay_out([("actor", 16)], eight, use_gpu=True), 8)  # whole nodes: spans as planned


def test_a_pool_planned_on_one_node_that_would_span_two_is_one_line():
    four = [Node("a", "10.0.0.1", 4), Node("b", "10.0.0.2", 4)]
    with pytest.raises(UserError) as err:
        check_nodes_as_planned(lay_out([("actor", 6), ("rest", 2)], four, use_gpu=True), 8)
    assert str(err.value) == ("placement.mode auto planned pool 'actor' (6 devices) on one node of 8 devices "
                              "(cluster.gpus_per_node), but laid over the Ray cluster's nodes (10.0.0.1 4, 10.0.0.2 4 "
                              "devices) it would span 2: set cluster.gpus_per_node to the devices of one node, or "
                              "placement.mode explicit with pools that fit the nodes")
    with pytest.raises(UserError, match=r"\(cluster.cpu_slots_per_node\).*set cluster.cpu_slots_per_node"):
        check_nodes_as_planned(lay_out([("pool0", 2)], [Node("a", "1", 1), Node("b", "2", 1)], use_gpu=False), 2,
                               "cluster.cpu_slots_per_node")
