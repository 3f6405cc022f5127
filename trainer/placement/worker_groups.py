"""From a recipe's roles to resource pools and worker groups, and the plan.json that records it.

Roles on the same pool are colocated: one process per device hosts all of them, and
they run one after another. Roles on different pools run at the same time.

  colocate    one pool with every device, every role on it
  split       the actor on one pool, every other role on a second pool
  standalone  one pool per role
  explicit    `placement.pools` (name -> devices) and `placement.roles` (role -> pool)
  auto        the auto-mapper's plan
(the pool sizes and each role's pool come from `pools.pool_layout`, which needs no torch).

In `trainer.mode: async` on the ray backend a `rollout` role generates on a pool of its own
(split: the training roles on pool `train`, the rollout role on pool `rollout`).
"""

from __future__ import annotations

from typing import Iterator

import torch

from hflow.engine.groups.ray_backend import RayCluster
from hflow.engine.groups.worker import LocalWorkerGroup, ResourcePool, WorkerGroup
from hflow.engine.workers.actor import ActorWorker
from hflow.engine.workers.critic import CostCriticWorker, CriticWorker
from hflow.engine.workers.reference import ReferenceWorker
from hflow.engine.workers.reward import CostWorker, RewardWorker
from hflow.engine.workers.rollout import RolloutWorker
from hflow.errors import UserError
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.placement.pools import ROLLOUT, pool_layout
from hflow.trainer.placement.worker_specs import worker_spec


def worker_class(role: str) -> type:
    return {"actor": ActorWorker, "reference": ReferenceWorker, "reward": RewardWorker, "cost": CostWorker,
            "critic": CriticWorker, "cost_critic": CostCriticWorker, "rollout": RolloutWorker}[role]


class WorkerGroups:
    """The run's worker groups by role, with the pools they live on."""

    def __init__(self, backend: str, pools: list[ResourcePool], groups: dict[str, WorkerGroup], cluster=None,
                 mapper_plan: dict | None = None):
        self.backend = backend
        self.pools = pools
        self.by_role = groups
        self.cluster = cluster
        self.mapper_plan = mapper_plan

    def __getitem__(self, role: str) -> WorkerGroup:
        return self.by_role[role]

    def get(self, role: str) -> WorkerGroup | None:
        return self.by_role.get(role)

    def items(self) -> Iterator[tuple[str, WorkerGroup]]:
        return iter(self.by_role.items())

    def colocated_with(self, role: str) -> list[str]:
        """The other roles on `role`'s pool: they run on its devices, one after another."""
        pool = self.by_role[role].pool
        return [r for r, g in self.by_role.items() if r != role and g.pool is pool]

    def busy_s(self) -> float:
        return sum(g.busy_s for g in self.by_role.values())

    def plan(self) -> dict:
        plan = {
            "backend": self.backend,
            "pools": [
                {"name": p.name, "devices": p.devices,
                 "roles": [r for r, g in self.by_role.items() if g.pool is p],
                 **({"processes": self.cluster.processes[p.name]} if self.cluster is not None else {})}
                for p in self.pools
            ],
            "roles": {r: {"pool": g.pool.name, "ranks": list(range(g.world_size))}
                      for r, g in self.by_role.items()},
        }
        if self.mapper_plan is not None:
            plan["auto_mapper"] = self.mapper_plan
        return plan

    def set_stage(self, name: str | None) -> None:
        if self.cluster is not None:
            self.cluster.stage = name

    def worker_stage_seconds(self) -> dict[str, float]:
        """Stage times measured inside the workers (ray backend; empty for local)."""
        return self.cluster.stage_seconds() if self.cluster is not None else {}

    def settle(self) -> None:
        """Wait for every call in flight (a no-op for the local backend, which never defers)."""
        if self.cluster is not None:
            self.cluster.settle()

    def lost_nodes(self) -> str | None:
        """On the ray backend, one line naming the nodes of this run the cluster lost and the roles
        they carried; None otherwise."""
        return self.cluster.lost_nodes() if self.cluster is not None else None

    def shutdown(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()


def device_count(recipe: Recipe, device: torch.device) -> int:
    if device.type == "cuda":
        visible = torch.cuda.device_count()
        wanted = recipe.cluster.gpus or visible
        if wanted > visible:
            raise UserError(f"cluster.gpus={wanted} but only {visible} GPUs are visible")
        return wanted
    return recipe.cluster.cpu_slots


def build_worker_groups(recipe: Recipe, roles: list[str], device: torch.device,
                        ray_address: str | None = None) -> WorkerGroups:
    """The run's worker groups. In `trainer.mode: async` on the ray backend the `rollout` role joins
    the roles, on a pool of its own (on the local backend the actor's generator thread samples)."""
    devices = device_count(recipe, device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    sizes, role_pool, mapper_plan = pool_layout(recipe, roles, devices, kind)
    backend = recipe.placement.backend
    if backend == "auto":
        backend = "local" if len(sizes) == 1 and sum(sizes.values()) == 1 and not ray_address else "ray"
    if recipe.trainer.mode == "async" and backend == "ray":
        roles = [*roles, ROLLOUT]
        sizes, role_pool, mapper_plan = pool_layout(recipe, roles, devices, kind)
        _check_rollout_pool(recipe, role_pool)
    if backend == "local":
        if len(sizes) != 1 or sum(sizes.values()) != 1:
            raise UserError(f"placement.backend local runs one colocated device; this placement has pools "
                            f"{sizes}: use placement.backend ray")
        pool = ResourcePool(next(iter(sizes)), ["cuda:0" if kind == "cuda" else "cpu"])
        groups = {r: LocalWorkerGroup(r, pool, worker_class(r), worker_spec(recipe, r, local=True)) for r in roles}
        return WorkerGroups("local", [pool], groups, mapper_plan=mapper_plan)
    return _ray_groups(recipe, roles, sizes, role_pool, kind, ray_address, mapper_plan)


def _check_rollout_pool(recipe: Recipe, role_pool: dict[str, str]) -> None:
    """The rollout role generates while the others train: it needs a pool no other role is on."""
    shared = [r for r, pool in role_pool.items() if r != ROLLOUT and pool == role_pool[ROLLOUT]]
    if shared:
        raise UserError(f"trainer.mode async on the ray backend generates on a pool of its own, but placement.mode "
                        f"{recipe.placement.mode} puts the rollout role on pool {role_pool[ROLLOUT]!r} with "
                        f"{', '.join(shared)}; use placement.mode split or standalone, or map rollout to a pool "
                        "of its own in placement.roles (or placement.backend: local, one device)")


def check_nodes_as_planned(placed: dict[str, list], per_node: int, key: str = "cluster.gpus_per_node") -> None:
    """placement: auto sized its pools for nodes of `per_node` devices (`key`: `cluster.gpus_per_node`, on
    a CPU run `cluster.cpu_slots_per_node`): a pool that fits one such node was planned on one node,
    and is not run across two."""
    nodes = {node.id: node for ranks in placed.values() for node in ranks}
    for pool, ranks in placed.items():
        spans = len({node.id for node in ranks})
        if len(ranks) <= per_node and spans > 1:
            sizes = ", ".join(f"{node.ip} {node.slots}" for node in nodes.values())
            raise UserError(f"placement.mode auto planned pool {pool!r} ({len(ranks)} devices) on one node of "
                            f"{per_node} devices ({key}), but laid over the Ray cluster's nodes ({sizes} devices) "
                            f"it would span {spans}: set {key} to the devices of one "
                            "node, or placement.mode explicit with pools that fit the nodes")


def _ray_groups(recipe, roles, sizes, role_pool, kind, ray_address, mapper_plan) -> WorkerGroups:
    offset = 0
    pools = []
    for name, size in sizes.items():
        pools.append(ResourcePool(name, [f"{kind}:{offset + i}" for i in range(size)]))
        offset += size
    cluster = RayCluster(ray_address, num_cpus=None if kind == "cuda" else max(offset, recipe.cluster.cpu_slots),
                         worker_timeout_s=recipe.trainer.worker_timeout_s)
    try:
        placed = cluster.place(pools, use_gpu=kind == "cuda")  # the node of every rank (`engine/groups/ray_nodes.py`)
        if mapper_plan is not None:
            check_nodes_as_planned(placed, mapper_plan["gpus_per_node"],
                                   "cluster.gpus_per_node" if kind == "cuda" else "cluster.cpu_slots_per_node")
        handles = {p.name: cluster.spawn_pool(p, use_gpu=kind == "cuda") for p in pools}
        by_name = {p.name: p for p in pools}
        groups = {r: cluster.add_role(handles[role_pool[r]], r, worker_class(r), by_name[role_pool[r]],
                                      worker_spec(recipe, r))
                  for r in roles}
    except BaseException:
        cluster.shutdown()
        raise
    return WorkerGroups("ray", pools, groups, cluster, mapper_plan)
