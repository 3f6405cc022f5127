"""One rank of the two-rank checkpoint test (tests/engine/training/test_train_engine.py), started with
torch.multiprocessing: a DeepSpeed engine over two gloo ranks, two updates on each rank's own rows, a
checkpoint, the next update; then a fresh engine from the initial weights loads the checkpoint and
takes that update again. Rank 0 writes what the test compares to `out_dir`; tests/ranks.py starts the ranks and ends them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def run(rank: int, world_size: int, port: int, stage: int, dtype: str, model_path: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    from hflow.engine.groups.dist import ensure_process_group
    from hflow.engine.models.loading import load_causal_lm
    from hflow.engine.training.master_state import MOMENTS
    from hflow.engine.training.train_engine import TrainEngine
    from hflow.trainer.config.sections import ActorConfig
    from hflow.trainer.placement.worker_specs import optim_spec

    ensure_process_group(torch.device("cpu"), rank, world_size)
    cfg = optim_spec(ActorConfig(lr=1e-2, zero_stage=stage, warmup_steps=1))
    ids = torch.randint(3, 50, (2, 12), generator=torch.Generator().manual_seed(rank))

    def engine():
        model = load_causal_lm(model_path, torch.float32).to(getattr(torch, dtype))
        return TrainEngine(model, cfg, total_updates=10, micro_batch_size=2, micro_steps=1, bf16=dtype == "bfloat16")

    def update(e):
        e.backward(e.forward(input_ids=ids, labels=ids).loss)
        return e.step()

    def states(e):  # collective: every rank gathers every tensor
        return {f"{key}/{name}": e._full_state(p, key).float().clone()
                for name, p in e._named_params() for key in ("param", *MOMENTS)}

    out = Path(out_dir)
    first = engine()
    update(first)
    update(first)
    first.save(out / "ckpt", rank)
    saved = states(first)
    norm_a = update(first)
    after_a = states(first)

    second = engine()
    second.load(out / "ckpt")
    loaded = states(second)
    norm_b = update(second)
    after_b = states(second)
    if rank == 0:
        gap = {"loaded": max(float((loaded[k] - saved[k]).abs().max()) for k in saved),
               "after": max(float((after_b[k] - after_a[k]).abs().max()) for k in after_a)}
        (out / "result.json").write_text(json.dumps({"gap": gap, "norms": [norm_a, norm_b],
                                                     "updates": second.updates, "tensors": len(saved)}))
