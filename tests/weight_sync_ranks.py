"""One rank of the two-rank weight-sync test (tests/engine/rollout/test_weight_sync.py), started with
torch.multiprocessing: DeepSpeed ZeRO on CPU (gloo), one optimizer update, then the weights
streamed in buckets. Everything the test checks is written to `out_dir`; tests/ranks.py starts the
ranks and ends them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def run(rank: int, world_size: int, port: int, stage: int, model_path: str, out_dir: str,
        bucket_bytes: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    import deepspeed

    from hflow.engine.groups.dist import ensure_process_group
    from hflow.engine.models.loading import load_causal_lm
    from hflow.engine.rollout.weight_sync import SyncStats, full_numel, weight_buckets

    ensure_process_group(torch.device("cpu"), rank, world_size)
    model = load_causal_lm(model_path, torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              # Persistence threshold 0: every parameter of the tiny model is really partitioned.
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(rank))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()  # the weights now differ from the checkpoint, and differ by rank's data

    module = engine.module
    named = list(module.named_parameters())
    zero3 = stage == 3
    buckets: list[dict] = []

    def consumer(pairs):
        names = [n for n, _ in pairs]
        # Under ZeRO-3 exactly this bucket is gathered while the consumer runs, nothing else.
        gathered = sorted(n for n, p in named if zero3 and p.data.numel() == full_numel(p) > 0)
        buckets.append({"names": names, "bytes": sum(t.numel() * t.element_size() for _, t in pairs),
                        "dtypes": sorted({str(t.dtype) for _, t in pairs}), "gathered": gathered})
        streamed.update({n: t.clone() for n, t in pairs})

    out = Path(out_dir)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        streamed: dict[str, torch.Tensor] = {}
        buckets = []
        stats = SyncStats()
        for pairs in weight_buckets(module, bucket_bytes, dtype, zero3, stats):
            consumer(pairs)  # runs while exactly this bucket is gathered
        torch.save(streamed, out / f"streamed-{rank}-{str(dtype).removeprefix('torch.')}.pt")
        results[str(dtype)] = {"buckets": buckets, "stats": vars(stats)}
    # Reference: the whole model gathered at once (the export path), independent of bucketing.
    params = [p for _, p in named]
    gather = deepspeed.zero.GatheredParameters(params) if zero3 else _nothing()
    with gather:
        reference = {n: p.data.clone() for n, p in named}
    torch.save(reference, out / f"reference-{rank}.pt")
    results["order"] = [n for n, _ in named]
    results["partitioned_outside"] = zero3 and all(p.data.numel() == 0 for p in params)
    (out / f"rank-{rank}.json").write_text(json.dumps(results))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
