"""`hflow map`: dry-run the auto-mapper on a recipe and print its placement plan."""

from __future__ import annotations

import json
import re
from typing import Annotated, Optional

import typer

from hflow.errors import UserError
from hflow.mapper.devices import DEVICES
from hflow.mapper.plan import plan_placement
from hflow.mapper.report import format_plan
from hflow.trainer.config.load import load_recipe


def map(  # noqa: A001 - the command is `hflow map`
    recipe: Annotated[str, typer.Argument(help="Recipe file, or a shipped recipe's name such as ppo/llama2-13b.")],
    gpus: Annotated[Optional[int], typer.Option(
        "--gpus", help="GPUs to plan for; default: the recipe's cluster.gpus, else the visible GPUs, "
                       "else CPU worker slots.")] = None,
    gpus_per_node: Annotated[Optional[int], typer.Option(
        "--gpus-per-node", help="GPUs per machine (tensor parallelism stays inside one); "
                                "default: cluster.gpus_per_node.")] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", help=f"GPU type: {', '.join(DEVICES)} or cpu; default: cluster.gpu.")] = None,
    top: Annotated[int, typer.Option("--top", min=0, help="Runners-up to show: the best plan of each "
                                                          "of the next K placements.")] = 3,
    json_: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
    set_: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Override a recipe key, e.g. --set trainer.prompts_per_step=512 (repeatable).")] = None,
    parallel: Annotated[str, typer.Option(
        "--parallel", help="zero: ZeRO data parallelism, what hflow train runs (the default); 3d: tensor x "
                           "pipeline x data parallel as in the paper, a plan hflow train cannot run marked "
                           "so with what it would need.")] = "zero",
    internode_gbps: Annotated[Optional[float], typer.Option(
        "--internode-gbps", help="Network bandwidth per machine in Gbit/s; default: the GPU type's "
                                 "(A100: 200, the paper's cluster).")] = None,
    train_layout: Annotated[Optional[str], typer.Option(
        "--train-layout", help="Pin the actor's and critic's training tensor x pipeline sizes, e.g. 8x1.")] = None,
    offload: Annotated[bool, typer.Option(
        "--offload", help="Allow keeping gradients and Adam states in CPU memory (ZeRO-Offload).")] = False,
) -> None:
    """Plan where each model of RECIPE runs: colocated sets, GPUs and parallel strategy per model.

    A dry run of the auto-mapper (HybridFlow, Algorithm 1): it tries every way to group the roles
    onto shared GPUs, every split of the GPUs and every parallel strategy, with analytic memory and
    time estimates. It prints the fastest plan and the runner-up placements; nothing runs on a GPU.
    By default it plans only what `hflow train` runs (ZeRO data parallelism); `--parallel 3d` plans
    as the paper does and says when `hflow train` cannot run the result.
    With trainer.mode async (in the recipe or --set trainer.mode=async) it also splits the GPUs
    between a rollout pool and the training roles, a step costing max(generation, training) + weight sync.
    """
    try:
        loaded, path = load_recipe(recipe, set_ or ())
        plan = plan_placement(loaded, gpus, gpus_per_node=gpus_per_node, gpu=gpu, parallel=parallel,
                              internode_gbps=internode_gbps, allow_offload=offload,
                              train_layout=_layout(train_layout), top=top)
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(plan) if json_ else format_plan(plan, str(path)))


def _layout(text: Optional[str]) -> Optional[tuple[int, int]]:
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or 0 in (int(match[1]), int(match[2])):
        raise UserError(f"--train-layout {text!r}: expected TPxPP with positive sizes, e.g. 8x1")
    return int(match[1]), int(match[2])
