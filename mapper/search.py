"""The placement search: Algorithm 1 of the HybridFlow paper (Section 6).

Every partition of the roles into colocated sets (a Bell number of them), every allocation of
devices to the sets that fits memory, and per set the fastest strategies of its models that fit
together. A stage costs the sum of its models' times within a set and the maximum across sets
(they run at the same time on different devices); the iteration is the sum of the stages.

Allocations give each set 1..(devices per node) devices or whole nodes, and may leave devices
idle: a plan on more devices can therefore never be slower than one on fewer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hflow.errors import UserError
from hflow.mapper.memory import colocated_peak
from hflow.mapper.strategy import Candidate, Setting, candidates

STAGES = ("generation", "preparation", "training")


def set_partitions(items: list[str]) -> list[list[list[str]]]:
    """Every way to split `items` into non-empty groups (Bell(len(items)) of them), order kept."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    found = []
    for partition in set_partitions(rest):
        found.append([[first], *partition])
        for i in range(len(partition)):
            found.append([*partition[:i], [first, *partition[i]], *partition[i + 1:]])
    return found


def device_counts(total: int, per_node: int) -> list[int]:
    """Sizes a colocated set may have: any part of one node, or whole nodes."""
    sizes = set(range(1, min(total, per_node) + 1)) | set(range(per_node, total + 1, per_node))
    return sorted(sizes)


@dataclass(frozen=True)
class SetPlan:
    """A colocated set on its devices, with each model's chosen strategy."""

    roles: tuple[str, ...]
    devices: int
    models: tuple[Candidate, ...]
    times: tuple[float, float, float]  # this set's seconds per stage
    peak: tuple[float, float, float]  # bytes per device at each stage's peak


@dataclass(frozen=True)
class Plan:
    sets: tuple[SetPlan, ...]
    stage_s: tuple[float, float, float]

    @property
    def iteration_s(self) -> float:
        return sum(self.stage_s)

    @property
    def devices(self) -> int:
        return sum(s.devices for s in self.sets)

    @property
    def placement(self) -> list[list[str]]:
        return [list(s.roles) for s in self.sets]


@dataclass
class SearchResult:
    best: Plan
    ranked: list[Plan]  # the best plan of each placement, fastest first
    total_devices: int
    search_s: float
    candidates_evaluated: int  # (placement, allocation) pairs costed
    strategies_simulated: int  # (model, devices, strategy) triples kept after pruning
    placements_searched: int  # partitions of the roles into colocated sets


class Mapper:
    """Caches strategies per (model, device count) and set plans per (set, device count)."""

    def __init__(self, setting: Setting):
        self.setting = setting
        self._cands: dict[tuple[str, int], list[Candidate]] = {}
        self._sets: dict[tuple[tuple[str, ...], int], SetPlan | None] = {}
        self.strategies_simulated = 0

    def role_candidates(self, role: str, n: int) -> list[Candidate]:
        key = (role, n)
        if key not in self._cands:
            self._cands[key] = candidates(self.setting, role, n)
            self.strategies_simulated += len(self._cands[key])
        return self._cands[key]

    def solve_set(self, roles: tuple[str, ...], n: int) -> SetPlan | None:
        """The fastest strategies for `roles` sharing n devices that fit memory together, or None."""
        key = (roles, n)
        if key not in self._sets:
            lists = [self.role_candidates(role, n) for role in roles]
            chosen = None if not all(lists) else _best_combination(lists, self.setting.capacity)
            self._sets[key] = None if chosen is None else _set_plan(roles, n, chosen)
        return self._sets[key]

    def search(self, total: int) -> SearchResult:
        start = time.perf_counter()
        counts = device_counts(total, self.setting.per_node)
        ranked, evaluated = [], 0
        partitions = set_partitions(self.setting.workload.roles)
        for partition in partitions:
            options = [[p for n in counts if (p := self.solve_set(tuple(group), n))] for group in partition]
            if not all(options):
                continue
            best, n_evaluated = _best_allocation(options, total)
            evaluated += n_evaluated
            if best is not None:
                ranked.append(best)
        if not ranked:
            raise UserError(self._no_fit_message(total))
        ranked.sort(key=lambda p: (round(p.iteration_s, 9), p.devices, len(p.sets)))
        return SearchResult(ranked[0], ranked, total, time.perf_counter() - start, evaluated,
                            self.strategies_simulated, len(partitions))

    def _no_fit_message(self, total: int) -> str:
        dev = self.setting.device.name
        roles = self.setting.workload.roles
        fix = "add devices or use a larger GPU type" if dev != "cpu" else "use a smaller model or a GPU machine"
        if dev != "cpu" and self.setting.parallel == "zero":
            fix += ("; this is ZeRO data parallelism, what hflow train runs: `hflow map --parallel 3d` plans "
                    "with the paper's tensor x pipeline parallelism, which hflow train does not run")
        alone = {}
        for role in roles:
            fitting = [n for n in device_counts(total, self.setting.per_node) if self.role_candidates(role, n)]
            if not fitting:
                need = self._devices_needed(role, total)
                return (f"no plan fits memory: the {role} model does not fit in {total} {dev} device(s) even alone"
                        + (f"; it needs about {need}" if need else "") + f" ({fix})")
            alone[role] = fitting[0]
        needs = ", ".join(f"{role} {n}" for role, n in alone.items())
        return (f"no plan fits memory in {total} {dev} device(s): alone the roles need at least {needs} device(s), "
                f"and they do not fit colocated either ({fix})")

    def _devices_needed(self, role: str, total: int) -> int | None:
        for n in device_counts(max(total * 64, 1024), self.setting.per_node):
            if n > total and self.role_candidates(role, n):
                return n
        return None


def _best_combination(lists: list[list[Candidate]], capacity: float) -> list[Candidate] | None:
    """Branch and bound over one candidate per model: least total time whose stage peaks fit.

    A stage's peak on a device is what every model keeps resident plus the largest transient
    need of the models running in it (they run one after another).
    """
    k = len(lists)
    min_time = [0.0] * (k + 1)
    min_res = [(0.0, 0.0, 0.0)] * (k + 1)
    for i in range(k - 1, -1, -1):
        min_time[i] = min_time[i + 1] + lists[i][0].total
        min_res[i] = tuple(m + min(c.resident[s] for c in lists[i]) for s, m in enumerate(min_res[i + 1]))
    best: list = [math.inf, None]

    def visit(i: int, spent: float, res: tuple, trans: tuple, chosen: list) -> None:
        if any(res[s] + min_res[i][s] + trans[s] > capacity for s in range(3)):
            return
        if i == k:
            best[0], best[1] = spent, list(chosen)
            return
        for cand in lists[i]:  # sorted by time, so the first misses end the loop
            if spent + cand.total + min_time[i + 1] >= best[0]:
                break
            chosen.append(cand)
            visit(i + 1, spent + cand.total,
                  tuple(a + b for a, b in zip(res, cand.resident)),
                  tuple(max(a, b) for a, b in zip(trans, cand.transient)), chosen)
            chosen.pop()

    visit(0, 0.0, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0), [])
    return best[1]


def _set_plan(roles: tuple[str, ...], n: int, chosen: list[Candidate]) -> SetPlan:
    times = tuple(sum(c.times[s] for c in chosen) for s in range(3))
    peak = colocated_peak([c.resident for c in chosen], [c.transient for c in chosen])
    return SetPlan(roles, n, tuple(chosen), times, peak)


def _best_allocation(options: list[list[SetPlan]], total: int) -> tuple[Plan | None, int]:
    """The cheapest choice of one SetPlan per set whose devices add up to at most `total`."""
    best: list = [math.inf, None, 0]
    k = len(options)
    min_devices = [0] * (k + 1)
    for i in range(k - 1, -1, -1):
        min_devices[i] = min_devices[i + 1] + min(p.devices for p in options[i])

    def visit(i: int, left: int, stage: tuple, chosen: list) -> None:
        if stage[0] + stage[1] + stage[2] > best[0] + 1e-9:
            return  # stage maxima only grow as sets are added
        if i == k:
            best[2] += 1
            cost = stage[0] + stage[1] + stage[2]
            if cost < best[0] - 1e-9 or (cost <= best[0] + 1e-9 and best[1] is not None
                                         and sum(p.devices for p in chosen) < best[1].devices):
                best[0], best[1] = cost, Plan(tuple(chosen), stage)
            return
        for plan in options[i]:
            if plan.devices + min_devices[i + 1] > left:
                break  # options are sorted by devices
            chosen.append(plan)
            visit(i + 1, left - plan.devices, tuple(max(a, b) for a, b in zip(stage, plan.times)), chosen)
            chosen.pop()

    visit(0, total, (0.0, 0.0, 0.0), [])
    return best[1], best[2]
