"""One rank of the two-rank ZeRO-3 lockstep test (tests/engine/training/test_lockstep.py), started
with torch.multiprocessing: a real DeepSpeed ZeRO-3 engine on CPU (gloo) over the tiny model, whose
ranks hold rows that would have them run different numbers of forwards. Each forward all-gathers
the layers' parameter shards, so a rank running one forward more waits for the other until the
process group's (short) timeout. Everything the test checks is written to `out_dir`; tests/ranks.py
starts the ranks and ends them.

Two scenarios, one after the other (rows per rank; letters are prompts, a repeated letter a
prompt's samples):
  scoring  `batched_log_probs`, 2 rows a micro-batch: rank 0 [A A B B] (2 micro-batches, both
           with a shared prompt), rank 1 [C C D E F F] (3, the middle one without)
  update   `micro_batches` + `response_log_probs` with gradients, backward and an optimizer step:
           rank 0 [A A B B] (sharing its prompts computes less), rank 1 [C D E G] (nothing to share)
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch

PROMPT, RESPONSE = 12, 3  # long prompts, short answers: sharing a prompt saves compute

ROWS = {"scoring": ["AABB", "CCDEFF"], "update": ["AABB", "CDEG"]}


def rows_batch(letters: str, vocab: int):
    """A rollout batch: one 12-token prompt per letter (the same letter, the same prompt), each
    row's 1-3 token response different."""
    from hflow.engine.groups.batch import Batch
    from hflow.engine.rollout.assembly import assemble_rollout

    def tokens(seed: int, count: int) -> list[int]:
        return torch.randint(3, vocab, (count,), generator=torch.Generator().manual_seed(seed)).tolist()

    prompts = [tokens(ord(letter), PROMPT - i % 3) for i, letter in enumerate(letters)]
    prompts = [prompts[letters.index(letter)] for letter in letters]  # a letter's rows: one prompt
    responses = torch.tensor([tokens(1000 + i, RESPONSE) for i in range(len(letters))])
    lengths = torch.tensor([1 + i % RESPONSE for i in range(len(letters))])
    return Batch(assemble_rollout(prompts, responses, lengths, pad_token_id=0))


def _engine(model_path: str):
    """The tiny model under DeepSpeed ZeRO-3 as `TrainEngine` builds it, but with a persistence
    threshold of 0: the tiny model's tensors are all under DeepSpeed's default (1e5 elements),
    which would keep them whole on every rank, and no forward would gather anything."""
    import deepspeed

    from hflow.engine.models.loading import load_causal_lm

    model = load_causal_lm(model_path, torch.float32)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "steps_per_print": 10**9}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    assert all(p.data.numel() == 0 for p in engine.module.parameters()), "ZeRO-3 left a tensor whole"
    return engine


def run(rank: int, world_size: int, port: int, model_path: str, out_dir: str, timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import deepspeed

    from hflow.engine.groups.dist import build_cpu_comm_op
    from hflow.engine.models.loading import load_causal_lm

    build_cpu_comm_op()
    deepspeed.init_distributed(dist_backend="gloo", timeout=timedelta(seconds=timeout_s), verbose=False)
    alone = load_causal_lm(model_path, torch.float32).eval()  # this rank's rows scored without ZeRO
    engine = _engine(model_path)
    forwards = []
    engine.module.register_forward_pre_hook(lambda *_: forwards.append(1))
    out, results = Path(out_dir), {}
    for scenario, run_scenario in (("scoring", _scoring), ("update", _update)):
        forwards.clear()
        batch = rows_batch(ROWS[scenario][rank], alone.config.vocab_size)
        got, want, shared = run_scenario(engine, alone, batch, world_size)
        torch.save({"got": got, "want": want}, out / f"{scenario}-{rank}.pt")
        results[scenario] = {"forwards": len(forwards), "shared": shared}
    (out / f"rank-{rank}.json").write_text(json.dumps(results))


def _scoring(engine, alone, batch, world_size: int):
    from hflow.engine.training.logprobs import batched_log_probs

    engine.module.eval()
    got = batched_log_probs(engine.module, batch, 0.7, 2, with_entropy=True, zero3=True)
    want = batched_log_probs(alone, batch, 0.7, 2, with_entropy=True)
    mask = batch["response_mask"]  # past a response's end the two ways of scoring read different padding
    return [t * mask for t in got], [t * mask for t in want], None


def _update(engine, alone, batch, world_size: int):
    from hflow.engine.training.logprobs import response_log_probs, shares_prompts
    from hflow.engine.training.packing import micro_batches

    micros = micro_batches(batch, 2, None, world_size, "cpu", share_prompts=True, zero3=True)
    got, want = [], []
    for i, micro in enumerate(micros):
        engine.set_gradient_accumulation_boundary(i == len(micros) - 1)
        log_probs, _ = response_log_probs(engine.forward, micro, 0.7)
        mask = micro["response_mask"]
        engine.backward((log_probs * mask).sum() / mask.sum(), scale_wrt_gas=False)
        engine.step()
        got.append(log_probs.detach() * mask)
        with torch.no_grad():
            want.append(response_log_probs(alone, micro, 0.7)[0] * mask)
    return got, want, [shares_prompts(engine.forward, m) for m in micros]
