"""A recipe's actor update and scoring pass through each CPU product route, side by side in one
process (`engine/kernels/product_route.py`: a library for each of the forward, the input gradient and the
weight gradient; `HFLOW_CPU_PRODUCTS`).

    python benchmarks/product_routes.py grpo/quickstart --set model.path=... --routes onednn,mixed,blas

One actor, two rollouts of the recipe's own prompts (random advantages: the work depends on the
batch's shapes, not its values); after a warm-up call of each route, --rounds rounds of an update
and a scoring pass (`compute_log_prob`) on the same batch through every route, the routes' order
reversed every other round. A route is a value of HFLOW_CPU_PRODUCTS with ':' between the three
kinds' libraries (onednn:onednn:blas); `mixed` is onednn:onednn:blas. Prints each route's median
seconds and every round's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hflow.engine.kernels import product_route
from hflow.trainer.config.load import load_recipe
from hflow.trainer.work.bench import _actor

from update_profile import _batches, _call

NAMED = {"mixed": "onednn,onednn,blas"}


def use(route: str) -> None:
    os.environ[product_route.ENV] = route
    product_route.chosen_route.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--set", action="append", default=[], help="a recipe override, as hflow's --set")
    parser.add_argument("--routes", default="onednn,mixed,blas", help="comma-separated routes")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    routes = {name: NAMED.get(name, name.replace(":", ",")) for name in args.routes.split(",")}
    for name, route in routes.items():
        if product_route.parse_route(route) is None:
            parser.error(f"--routes: {name!r} is no route (onednn, blas, mixed, or three joined by ':')")
    recipe, _ = load_recipe(args.recipe, ["trainer.eval_every=0", *args.set])
    groups, data = _actor(recipe)
    times = {(name, phase): [] for name in routes for phase in ("update", "score")}
    try:
        actor = groups["actor"]
        warm, batch = _batches(actor, data, 2, scored=True)
        for route in routes.values():
            use(route)
            for phase in ("update", "score"):
                _call(actor, phase, warm, data, 0)
        for i in range(args.rounds):
            for name in (list(routes) if i % 2 == 0 else list(routes)[::-1]):
                use(routes[name])
                for phase in ("update", "score"):
                    start = time.perf_counter()
                    _call(actor, phase, batch, data, 0)
                    times[(name, phase)].append(time.perf_counter() - start)
    finally:
        groups.shutdown()
    print(f"{'route':30}{'phase':>8}{'median s':>10}  rounds")
    for (name, phase), seconds in times.items():
        print(f"{name + ' (' + routes[name] + ')':30}{phase:>8}{statistics.median(seconds):>10.3f}  "
              + " ".join(f"{s:.3f}" for s in seconds))


if __name__ == "__main__":
    main()
