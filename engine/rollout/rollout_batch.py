"""How a rollout is sampled and handed back, for every worker that generates one.

The actor generates on its training module (`generate_sequences`) or on its generator copy
(`generate_async`), and in asynchronous mode on the Ray backend a worker of the `rollout` role
generates on its own pool (`workers/rollout.py`). All three sample a step's prompts with the
same seeds and return the same Batch layout, so that with the same weights they return the
same rollout (asynchronous mode with `max_staleness: 0` reproduces the synchronous run).
"""

from __future__ import annotations

import time

import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.padding import pad_rollout
from hflow.engine.rollout.generation import SamplingParams
from hflow.engine.seeding import stream_seed
from hflow.engine.specs import RolloutSpec


def sampling_for(prompts: Batch, rollout: RolloutSpec, seed: int, rank: int,
                 device: torch.device) -> tuple[SamplingParams, int, torch.Generator]:
    """How to sample `prompts`: the parameters, responses per prompt and the seeded generator.

    The seed depends on the run's seed, the stream (rollout or evaluation), the step, the rank
    and DAPO's sampling round, never on which worker samples."""
    # {n, temperature, max_response_length, batch_size[, stream]}: `trainer/control/evaluate.py`
    evaluation = prompts.meta.get("eval")
    # Evaluation never draws from the rollout's stream; each held-out set's sampling has its own.
    stream = evaluation.get("stream", "eval") if evaluation else "rollout"
    # DAPO's extra sampling rounds of a step (`round` >= 1) each draw from their own stream.
    rounds = [prompts.meta["round"]] if prompts.meta.get("round") else []
    # A streamed step's chunks (`rollout.stream_prompts`), each its own generation call, draw from
    # their own streams too; chunk 0 (and an unstreamed step) keeps the step's.
    chunks = ["chunk", prompts.meta["chunk"]] if prompts.meta.get("chunk") else []
    rng = torch.Generator(device=device).manual_seed(
        stream_seed(seed, stream, prompts.meta["step"], rank, *rounds, *chunks))
    greedy = bool(prompts.meta.get("greedy", False))
    params = SamplingParams(rollout.max_response_length, rollout.temperature, rollout.top_p, rollout.top_k,
                            greedy=greedy)
    n = 1 if greedy else rollout.n  # greedy decoding gives one response per prompt (ReMax's baseline)
    if evaluation:
        t = evaluation["temperature"]
        params = SamplingParams(evaluation["max_response_length"], t or 1.0, rollout.top_p, rollout.top_k,
                                greedy=t == 0, batch_size=evaluation.get("batch_size"))
        n = evaluation["n"]
    return params, n, rng


def rollout_batch(prompts: Batch, out: dict, n: int, recompute_old_log_probs: bool, world_size: int,
                  pad: int, device: torch.device) -> Batch:
    """The generator's output as the rollout Batch: each prompt row repeated n times with its
    responses. Over several ranks every rank pads to the group's widest prompt and response (a
    collective), so that the ranks' pieces concatenate."""
    episode = {col.EPISODE: out.pop(col.EPISODE)} if col.EPISODE in out else {}
    if world_size > 1:
        out = _agree_on_widths(out, pad, device)
    if not recompute_old_log_probs:
        # Exactly on-policy: the sampler's log-probs are the old policy's.
        out[col.OLD_LOG_PROBS], out[col.ENTROPY] = out[col.ROLLOUT_LOG_PROBS], out[col.ROLLOUT_ENTROPY]
    if col.POLICY_VERSION not in out and "policy_version" in prompts.meta:  # sync mode: the controller's count
        out[col.POLICY_VERSION] = torch.full((len(out[col.RESPONSES]),), prompts.meta["policy_version"], dtype=torch.long)
    out[col.GENERATED_AT] = torch.full((len(out[col.RESPONSES]),), time.time(), dtype=torch.float64)
    return prompts.repeat(n) | Batch(out, episode)


def _agree_on_widths(out: dict[str, torch.Tensor], pad: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Every rank pads its rollout to the group's widest prompt and response (padding is cut
    again before any compute)."""
    width_r = out[col.RESPONSE_MASK].shape[1]
    widths = torch.tensor([out[col.ATTENTION_MASK].shape[1] - width_r, width_r], device=device)
    torch.distributed.all_reduce(widths, op=torch.distributed.ReduceOp.MAX)
    return pad_rollout(out, int(widths[0]), int(widths[1]), pad)
