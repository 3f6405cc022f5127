"""The optimizer step of a ZeRO-0 float32 engine with the engine's own clipping against DeepSpeed's
(`engine/training/train_engine.py`, `clips_itself`), on one model, rounds alternating.

    python benchmarks/clip_step.py --model models/smollm2-135m-instruct --rounds 6

Two engines on two copies of the model: one clipping itself, one leaving it to DeepSpeed and
measuring the norm it reports first (the engine before 2026-11-28). Each round gives both the same
micro-batch's gradients and times the optimizer step (the norm, clipping, AdamW), medians over the
rounds, at a gradient clip that clips (1e-3) and at one that does not (1e9).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training import train_engine
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.placement.worker_specs import optim_spec


def engines(model_dir: str, clip: float) -> dict:
    """The two engines: `clips_itself` as it is, and one answering no (DeepSpeed clips)."""
    cfg = optim_spec(ActorConfig(lr=1e-6, zero_stage=0, grad_clip=clip))
    rule, made = train_engine.clips_itself, {}
    try:
        for name, clips in (("engine clips", rule), ("DeepSpeed clips", lambda zero_stage, bf16: False)):
            train_engine.clips_itself = clips
            model = load_causal_lm(model_dir, torch.float32)
            made[name] = train_engine.TrainEngine(model, cfg, total_updates=100, micro_batch_size=4,
                                                  micro_steps=1, bf16=False)
    finally:
        train_engine.clips_itself = rule
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    ensure_process_group(torch.device("cpu"))
    for clip in (1e-3, 1e9):
        made = engines(a.model, clip)
        times = {name: [] for name in made}
        vocab = next(iter(made.values())).module.config.vocab_size
        ids = torch.randint(3, min(1000, vocab), (4, 32), generator=torch.Generator().manual_seed(0))
        for r in range(a.rounds + 1):
            for name in (list(made) if r % 2 == 0 else list(made)[::-1]):
                engine = made[name]
                engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
                start = time.perf_counter()
                if name == "DeepSpeed clips":  # the engine measured the norm it reports, as it did then
                    torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters() if p.grad is not None])
                engine.step()
                if r:  # the first round allocates Adam's moments
                    times[name].append((time.perf_counter() - start) * 1e3)
        clipped = "clips" if clip < 1 else "does not clip"
        print(f"grad_clip {clip:g} ({clipped}): " + "; ".join(
            f"{name} {statistics.median(t):.1f} ms (all {', '.join(f'{x:.0f}' for x in sorted(t))})"
            for name, t in times.items()))


if __name__ == "__main__":
    main()
