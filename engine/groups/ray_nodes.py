"""Which node of a Ray cluster each rank of a run's pools goes to, and which roles a lost node carried.

The pools' devices are laid over the cluster's nodes in order, as the auto-mapper plans them (its
pools are contiguous ranges of devices over nodes of `--gpus-per-node`): the node of the process
that drives the run first, then the others by address. A pool stays on one node unless it is
larger than what is left there; it then continues on the next node, and its torch.distributed
rendezvous is at its rank 0's node. The placement is fixed when the run starts: a node that joins
later is not used (a run continued with `--resume` lays its pools out again, over the nodes alive
then). `plan.json` records the planned node of every rank beside where it runs.

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
    """Each pool's node per rank: the pools' devices, in order, over the nodes' slots in order.
    Raises a UserError when the pools need more devices than the nodes have."""
    need = sum(size for _, size in pools)
    have = sum(n.slots for n in nodes)
    if need > have:
        kind = "GPUs" if use_gpu else "CPU slots"
        pools_text = ", ".join(f"{name} {size}" for name, size in pools)
        nodes_text = ", ".join(f"{n.ip} {n.slots}" for n in nodes) or "none with any"
        raise UserError(f"the run's pools need {need} {kind} ({pools_text}) and the Ray cluster's alive nodes "
                        f"have {have} ({nodes_text}): add nodes, or lower cluster.gpus / cluster.cpu_slots")
    slots = [node for node in nodes for _ in range(node.slots)]
    placed, start = {}, 0
    for name, size in pools:
        placed[name] = slots[start:start + size]
        start += size
    return placed


def lost_line(dead: set[str], ranks: list[dict]) -> str | None:
    """One line naming the nodes in `dead` (ids) that carried ranks of the run and the roles they
    carried, or None when none did. `ranks`: per rank {node_id, ip, pool, rank, roles}."""
    carried: dict[tuple[str, str], list[str]] = {}
    for r in ranks:
        if r["node_id"] in dead:
            carried.setdefault((r["ip"], r["node_id"]), []).extend(f"{role} rank {r['rank']}" for role in r["roles"])
    if not carried:
        return None
    nodes = "; ".join(f"node {ip} (Ray node {node_id[:8]}) carried {', '.join(sorted(roles))}"
                      for (ip, node_id), roles in carried.items())
    return (f"the Ray cluster lost {'a node' if len(carried) == 1 else f'{len(carried)} nodes'} during the run: {nodes}; "
            "its last checkpoint is kept: `hflow train --resume RUN_DIR` continues once the cluster has "
            "the devices again")
