"""Pool sizes and the pool of each role, for the recipe's placement mode (no torch: `hflow validate`
checks a GPU recipe's memory on these pools, and `worker_groups.build_worker_groups` builds them).

  colocate    one pool with every device, every role on it
  split       the actor on one pool, every other role on a second pool
  standalone  one pool per role
  explicit    `placement.pools` (name -> devices) and `placement.roles` (role -> pool)
  auto        the auto-mapper's plan (`hflow.mapper.plan_placement`, ZeRO data parallelism only)

In `trainer.mode: async` on the ray backend a `rollout` role generates on a pool of its own
(split: the training roles on pool `train`, the rollout role on pool `rollout`).
"""

from __future__ import annotations

from typing import NamedTuple

from hflow.errors import UserError
from hflow.mapper import plan_placement
from hflow.trainer.config.recipe import Recipe

ROLLOUT = "rollout"  # async mode's generator on its own pool (`engine/workers/rollout.py`)


class Layout(NamedTuple):
    sizes: dict[str, int]  # pool name -> devices
    role_pool: dict[str, str]  # role -> pool name
    mapper_plan: dict | None = None  # the auto-mapper's full answer, for placement: auto


def pool_layout(recipe: Recipe, roles: list[str], devices: int, device_kind: str = "cpu") -> Layout:
    """Pool sizes and the pool of each role, for the recipe's placement mode."""
    mode = recipe.placement.mode
    if mode == "colocate":
        return Layout({"pool0": devices}, {r: "pool0" for r in roles})
    if mode == "split":
        if devices < 2:
            raise UserError(f"placement.mode split needs at least 2 devices; this run has {devices} "
                            "(set cluster.cpu_slots or cluster.gpus)")
        if ROLLOUT in roles:  # async mode: generation on one side, every training role on the other
            return Layout({"train": devices - devices // 2, ROLLOUT: devices // 2},
                          {r: ROLLOUT if r == ROLLOUT else "train" for r in roles})
        return Layout({"actor": devices - devices // 2, "rest": devices // 2},
                      {r: "actor" if r == "actor" else "rest" for r in roles})
    if mode == "standalone":
        if devices < len(roles):
            raise UserError(f"placement.mode standalone needs a device per role ({len(roles)}: "
                            f"{', '.join(roles)}); this run has {devices}")
        share = devices // len(roles)
        return Layout({r: share for r in roles}, {r: r for r in roles})
    if mode == "explicit":
        return Layout(*_explicit(recipe, roles))
    if mode == "auto":
        return _auto(recipe, roles, devices, device_kind)
    raise UserError(f"placement.mode {mode!r}: accepted: colocate, split, standalone, explicit, auto")


def _auto(recipe: Recipe, roles: list[str], devices: int, device_kind: str) -> Layout:
    """Ask the auto-mapper. Its plans for this engine use ZeRO data parallelism only (the hf
    generator and DeepSpeed have no tensor or pipeline parallelism); roles without a model
    (a reward function) join the actor's pool."""
    # Async mode's rollout pool only where the rollout role runs (the ray backend; on the local
    # backend the actor's generator thread samples, in the one process the sync plan places).
    plan = plan_placement(recipe, gpus=devices, gpu="cpu" if device_kind == "cpu" else None, parallel="zero",
                          mode="async" if ROLLOUT in roles else "sync")
    sizes = {p["name"]: p["devices"] for p in plan["pools"]}
    actor_pool = plan["roles"]["actor"]["pool"]
    role_pool = {r: plan["roles"][r]["pool"] if r in plan["roles"] else actor_pool for r in roles}
    return Layout(sizes, role_pool, plan)


def _explicit(recipe: Recipe, roles: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    pools, mapping = recipe.placement.pools, recipe.placement.roles
    missing = [r for r in roles if r not in mapping]
    if missing:
        raise UserError(f"placement.roles: no pool for {', '.join(missing)}; map every role of this run "
                        f"({', '.join(roles)}) to one of: {', '.join(pools) or '(no pools defined)'}")
    for role, pool in mapping.items():
        if pool not in pools:
            raise UserError(f"placement.roles.{role}: pool {pool!r} is not in placement.pools "
                            f"({', '.join(pools) or 'none defined'})")
    for pool, size in pools.items():
        if size < 1:
            raise UserError(f"placement.pools.{pool}: {size} devices; a pool needs at least 1")
    used = {p: n for p, n in pools.items() if p in {mapping[r] for r in roles}}
    return used, {r: mapping[r] for r in roles}
