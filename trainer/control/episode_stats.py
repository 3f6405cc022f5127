"""What a step's multi-turn episodes (`rollout.env`) add to events.jsonl and samples.jsonl.

events.jsonl, per step: `episode/turns_mean`, `episode/return_mean`, the share of episodes that
ended each way (`episode/ended_done`, `_max_turns`, `_max_tokens`, `_timeout`), the share that
called a tool and the calls per episode (environments that count `tool_calls`, as
`ToolEnv` does), and per turn k: `episode/turn{k}_generate_s` (that turn's batched generation),
`episode/turn{k}_env_s` (mean environment step) and `episode/turn{k}_live` (episodes still
running). samples.jsonl shows each sampled episode turn by turn.
"""

from __future__ import annotations

ENDINGS = ("done", "max_turns", "max_tokens", "timeout")


def episode_metrics(episodes: list[dict]) -> dict[str, float]:
    count = len(episodes)
    if not count:
        return {}
    metrics = {
        "episode/turns_mean": sum(len(e["turns"]) for e in episodes) / count,
        "episode/return_mean": sum(e["return"] for e in episodes) / count,
        **{f"episode/ended_{end}": sum(e["ended"] == end for e in episodes) / count for end in ENDINGS},
    }
    calls = [e["tool_calls"] for e in episodes if e.get("tool_calls") is not None]
    if calls:
        metrics["episode/tool_call_share"] = sum(c > 0 for c in calls) / len(calls)
        metrics["episode/tool_calls_mean"] = sum(calls) / len(calls)
    for k in range(max(len(e["turns"]) for e in episodes)):
        turns = [e["turns"][k] for e in episodes if len(e["turns"]) > k]
        metrics[f"episode/turn{k + 1}_live"] = float(len(turns))
        metrics[f"episode/turn{k + 1}_generate_s"] = turns[0].get("generate_s", 0.0)
        metrics[f"episode/turn{k + 1}_env_s"] = sum(t.get("env_s", 0.0) for t in turns) / len(turns)
    return metrics


def episode_sample(episode: dict) -> dict:
    """An episode for samples.jsonl: per turn the assistant's text, the observation, the reward."""
    turns = [{"assistant": t.get("assistant", ""), "observation": t.get("observation", []),
              "reward": t.get("reward", 0.0), "tokens": t.get("tokens", 0)} for t in episode["turns"]]
    return {"turns": turns, "ended": episode["ended"], "return": episode["return"],
            **({"tool_calls": episode["tool_calls"]} if episode.get("tool_calls") is not None else {})}
