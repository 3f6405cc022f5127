"""Multi-turn episodes: the model samples a turn, the environment answers, repeat (`rollout.env`).

Token in, token out: an episode's response is its sampled turns, each kept exactly as sampled,
with the environment's observation tokens between them (`chat_delta.py`: only the new messages
are tokenized, never the conversation). The observation tokens are attended to but not trained
on: their `response_mask` is 0 and their rollout log-probs 0 (`assembly.py`).

The episodes of a step run together: each round generates one turn for every live episode in
one batch (the `hf` engine, its context re-encoded from the token ids so far), then runs their
environments' steps at once in a thread pool; finished episodes leave. An episode ends when its
environment says done, at `rollout.max_turns`, when the next turn would have no room within
`max_response_length` tokens, or past `rollout.episode_timeout_s` seconds. A turn samples at most
`rollout.max_turn_tokens`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from hflow.engine import columns as col
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.rollout.chat_delta import ChatDelta
from hflow.engine.rollout.environment import EpisodeLimits, checked_step, discounted_return
from hflow.errors import UserError


@dataclass
class Episode:
    env: object
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    ended: str = ""
    started: float = field(default_factory=time.monotonic)

    def add(self, ids: list[int], sampled: bool, log_probs=None, entropy=None) -> None:
        self.tokens += ids
        self.trained += [int(sampled)] * len(ids)
        self.log_probs += list(log_probs) if sampled else [0.0] * len(ids)
        self.entropy += list(entropy) if sampled else [0.0] * len(ids)


class EpisodeRunner:
    """Runs the episodes of a batch of data rows against fresh instances of `env_cls`."""

    def __init__(self, generator, tokenizer, env_cls: type, spec: str, limits: EpisodeLimits,
                 workers: int = 8):
        self.generator, self.tokenizer = generator, tokenizer
        self.env_cls, self.spec, self.limits = env_cls, spec, limits
        self.workers = workers

    def run(self, rows: list[dict], prompt_ids: list[list[int]], n: int, params, rng) -> dict:
        """The rollout dict (`assembly.assemble_rollout`) of n episodes per row, plus the
        `episode` column: one record per row (`columns.EPISODE`)."""
        episodes, delta = self._start(rows, prompt_ids, n)
        with ThreadPoolExecutor(self.workers) as pool:
            for turn in range(self.limits.max_turns):
                live = [e for e in episodes if not e.ended]
                if not live:
                    break
                generate_s = self._generate_turn(live, params, rng)
                self._step_envs(live, pool, delta, turn, generate_s)
        for e in episodes:
            e.ended = e.ended or "max_turns"
        return self._assemble(episodes)

    def _start(self, rows: list[dict], prompt_ids: list[list[int]], n: int):
        episodes, delta = [], None
        for row, ids in zip(rows, prompt_ids):
            for _ in range(n):
                env = self.env_cls()
                if hasattr(env, "tokenizer"):  # ToolEnv parses calls with the tokenizer's own parser
                    env.tokenizer = self.tokenizer
                if delta is None:
                    delta = ChatDelta(self.tokenizer, getattr(env, "tool_specs", None))
                messages = self._call(env.reset, dict(row), "reset")
                episodes.append(Episode(env, list(ids) if messages is None else delta.prompt_ids(messages)))
        return episodes, delta

    def _call(self, method, arg, name: str):
        try:
            return method(arg)
        except UserError:
            raise
        except Exception as err:
            first = str(err).splitlines()[0] if str(err) else ""
            raise UserError(f"rollout.env {self.spec!r}: {name}() raised {type(err).__name__}: {first}") from err

    def _generate_turn(self, live: list[Episode], params, rng) -> float:
        """One sampled turn for every live episode, appended to it; the seconds it took."""
        start = time.monotonic()
        per_turn = self.limits.max_turn_tokens or self.limits.max_tokens
        room = [min(per_turn, self.limits.max_tokens - len(e.tokens)) for e in live]
        out = self.generator.generate([e.prompt + e.tokens for e in live], 1,
                                      replace(params, max_new_tokens=max(1, *room)), rng)
        lengths = out[col.RESPONSE_MASK].sum(-1).tolist()
        for row, (e, length, own_room) in enumerate(zip(live, lengths, room)):
            length = min(length, own_room)  # every episode's turn is cut to its own room
            e.add(out[col.RESPONSES][row, :length].tolist(), True,
                  out[col.ROLLOUT_LOG_PROBS][row, :length].tolist(), out[col.ROLLOUT_ENTROPY][row, :length].tolist())
            e.turns.append({"tokens": length})
        return time.monotonic() - start

    def _step_envs(self, live: list[Episode], pool, delta: ChatDelta, turn: int, generate_s: float) -> None:
        texts = [self.tokenizer.decode(e.tokens[len(e.tokens) - e.turns[-1]["tokens"]:], skip_special_tokens=True)
                 for e in live]
        results = list(pool.map(self._timed_step, live, texts))
        for e, text, (result, env_s) in zip(live, texts, results):
            messages, reward, done = checked_step(result, self.spec)
            record = e.turns[-1]
            record.update(assistant=text, observation=messages, reward=reward,
                          generate_s=round(generate_s, 6), env_s=round(env_s, 6))
            turn_ids = e.tokens[len(e.tokens) - record["tokens"]:]
            if done:
                e.ended = "done"
            elif time.monotonic() - e.started > self.limits.timeout_s:
                e.ended = "timeout"
            elif turn + 1 < self.limits.max_turns:
                ids = delta.observation_ids(messages, turn_ids)
                if len(e.tokens) + len(ids) >= self.limits.max_tokens:
                    e.ended = "max_tokens"  # no room for the observation and a turn after it
                else:
                    e.add(ids, False)

    def _timed_step(self, episode: Episode, text: str):
        start = time.monotonic()
        result = self._call(episode.env.step, text, "step")
        return result, time.monotonic() - start

    def _assemble(self, episodes: list[Episode]) -> dict:
        lengths = torch.tensor([len(e.tokens) for e in episodes], dtype=torch.long)
        width = max(1, int(lengths.max()))

        def table(name: str, dtype, fill=0):
            out = torch.full((len(episodes), width), fill, dtype=dtype)
            for row, e in enumerate(episodes):
                out[row, :len(e.tokens)] = torch.tensor(getattr(e, name), dtype=dtype)
            return out

        out = assemble_rollout([e.prompt for e in episodes], table("tokens", torch.long, self.generator.pad),
                               lengths, self.generator.pad, trained=table("trained", torch.long),
                               rollout_log_probs=table("log_probs", torch.float),
                               rollout_entropy=table("entropy", torch.float))
        out[col.EPISODE] = [self._record(e) for e in episodes]
        return out

    def _record(self, e: Episode) -> dict:
        rewards = [t.get("reward", 0.0) for t in e.turns]
        return {"return": discounted_return(rewards, self.limits.discount), "turns": e.turns, "ended": e.ended,
                "tool_calls": getattr(e.env, "tool_calls", None)}
