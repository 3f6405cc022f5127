"""`hflow import-gguf FILE OUT_DIR`: a local GGUF file as a plain Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hflow.cli.quiet import quiet_libraries
from hflow.engine.models.gguf_import import import_gguf as run_import


def import_gguf(
    file: Annotated[Path, typer.Argument(help="A .gguf file of an architecture transformers can load.")],
    out_dir: Annotated[Path, typer.Argument(help="New (or empty) directory to write the model into.")],
) -> None:
    """Dequantize FILE to fp32 and write OUT_DIR: config.json, model.safetensors, the tokenizer
    (with its chat template) and generation_config.json; `model.path: OUT_DIR` then trains it.
    Nothing is downloaded. Needs: pip install gguf accelerate."""
    quiet_libraries()
    typer.echo(str(run_import(file, out_dir)))
