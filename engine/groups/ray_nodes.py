"""Which node of a Ray cluster each rank of a run's pools goes to, and which roles a lost node carried.

The nodes are taken in order: the node of the process that drives the run first, then the others
by address. Each pool in turn goes whole on the first node with room for it (first fit: a pool of
4 GPUs, then one of 8, then one of 4 on nodes of 8 use two nodes, not three); a pool larger than
any node's room spans the free devices in node order, whole nodes then the rest, and its
torch.distributed rendezvous is at its rank 0's node. That is how the auto-mapper sizes pools
(part of one node, or whole nodes of `cluster.gpus_per_node`). The placement is fixed when the run
starts: a node that joins later is not used (a run continued with `--resume` lays its pools out
again, over the nodes alive then). `plan.json` records the planned node of every rank beside
where it runs.

A device is a GPU on a GPU run, a CPU slot (`ray start --num-cpus`) otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from hflow.errors import UserError


@dataclass(frozen=True)
class Node:
    id: str  # Ray's node id (hex)
    ip: str
    slots: int  # devices this run may use on it: GPUs, or CPU slots on a CPU run


def alive_nodes(ray_nodes: list[dict], here: str, use_gpu: bool) -> list[Node]:
    """The alive nodes of `ray.nodes()` with devices, the node `here` (the driver's) first, then by
    address and id."""
    resource = "GPU" if use_gpu else "CPU"
    nodes = [Node(n["NodeID"], n["NodeManagerAddress"], int(n.get("Resources", {}).get(resource, 0)))
             for n in ray_nodes if n.get("Alive")]
    return sorted((n for n in nodes if n.slots > 0), key=lambda n: (n.id != here, n.ip, n.id))


def lay_out(pools: list[tuple[str, int]], nodes: list[Node], use_gpu: bool) -> dict[str, list[Node]]:
    """Each pool's node per rank, pool by pool: on the first node with room for all of it, else over
    the free devices, whole free nodes first (the module's docstring). Raises a UserError when the
    pools need more devices than the nodes have."""
    need = sum(size for _, size in pools)
    have = sum(n.slots for n in nodes)
    if need > have:
        kind = "GPUs" if use_gpu else "CPU slots"
        pools_text = ", ".join(f"{name} {size}" for name, size in pools)
        nodes_text = ", ".join(f"{n.ip} {n.slots}" for n in nodes) or "none with any"
        raise UserError(f"the run's pools need {need} {kind} ({pools_text}) and the Ray cluster's alive nodes "
                        f"have {have} ({nodes_text}): add nodes, or lower cluster.gpus / cluster.cpu_slots")
    free = {node.id: node.slots for node in nodes}
    placed = {}
    for name, size in pools:
        home = next((node for node in nodes if free[node.id] >= size), None)
        if home is not None:
            free[home.id] -= size
            placed[name] = [home] * size
            continue
        ranks = []
        for node in sorted(nodes, key=lambda n: free[n.id] != n.slots):  # whole free nodes first, in order
            take = min(free[node.id], size - len(ranks))
            free[node.id] -= take
            ranks += [node] * take
        placed[name] = ranks
    return placed


def lost_line(dead: set[str], ranks: list[dict]) -> str | None:
    """One line naming the nodes in `dead` (ids) that carried ranks of the run and the roles they
    carried, or None when none did. `ranks`: per rank its process as plan.json records it ({node,
    node_id, ...}) with its pool, rank and roles."""
    carried: dict[tuple[str, str], list[str]] = {}
    for r in ranks:
        if r["node_id"] in dead:
            carried.setdefault((r["node"], r["node_id"]), []).extend(f"{role} rank {r['rank']}" for role in r["roles"])
    if not carried:
        return None
    nodes = "; ".join(f"node {ip} (Ray node {node_id[:8]}) carried {', '.join(sorted(roles))}"
                      for (ip, node_id), roles in carried.items())
    lost = "a node" if len(carried) == 1 else f"{len(carried)} nodes"
    return (f"the Ray cluster lost {lost} during the run: {nodes}; its last checkpoint is kept: "
            "`hflow train --resume RUN_DIR` continues once the cluster has the devices again")
