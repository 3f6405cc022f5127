"""Multi-turn episodes: the model samples a turn, the environment answers, repeat (`rollout.env`).

Token in, token out: an episode's response is its sampled turns, each kept exactly as sampled,
with the environment's observation tokens between them (`chat_delta.py`: only the new messages
are tokenized, never the conversation). The observation tokens are attended to but not trained
on: their `response_mask` is 0 and their rollout log-probs 0 (`assembly.py`).

The episodes of a step advance together: every episode that waits for a turn is generated in
one batch (the `hf` engine re-encodes each context from the token ids so far; `vllm` takes them
as token prompts and reuses the shared prefixes' KV cache), then their environments' steps run in
a thread pool, off the generation path. The next batch is whoever has finished stepping: the
runner waits for slow steps at most a quarter of the last generation's time (`STRAGGLER_SHARE`,
at least `STRAGGLER_MIN_S`), then generates for the ready ones, so a slow tool holds back its own
episode, not the batch. Finished episodes leave. An episode ends when its environment says done, at `rollout.max_turns`,
when the next turn would have no room within `max_response_length` tokens, or past
`rollout.episode_timeout_s` seconds, even inside a step that has not returned (the step's thread
is abandoned: Python cannot stop it; it is a daemon, so it does not hold the process at exit). A
turn samples at most `rollout.max_turn_tokens`; one that fills its room without an end-of-sequence
token is marked `cut` in the episode's record of its turns.

`step` (and `reset`) may be coroutines (`async def`): each runs to completion on its own event
loop in a pool thread.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace

import torch

from hflow.engine import columns as col
from hflow.engine.rollout.assembly import assemble_rollout
from hflow.engine.rollout.chat_delta import ChatDelta
from hflow.engine.rollout.environment import EpisodeLimits, checked_step, discounted_return
from hflow.errors import UserError, first_line

STRAGGLER_SHARE = 0.25  # of the last generation's seconds: how long ready episodes wait for slow steps
STRAGGLER_MIN_S = 0.02  # and at least this: steps of a few milliseconds join the same batch


class DaemonPool:
    """`submit(fn, *args) -> Future`, each call in its own daemon thread, at most `workers` running
    at once. Unlike ThreadPoolExecutor's threads, which the interpreter joins at exit, a step left
    behind past its deadline cannot keep the process from ending."""

    def __init__(self, workers: int):
        self.slots = threading.BoundedSemaphore(workers)

    def submit(self, fn, *args) -> Future:
        future: Future = Future()

        def run():
            with self.slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(fn(*args))
                except BaseException as err:
                    future.set_exception(err)

        threading.Thread(target=run, daemon=True, name="hflow-env-step").start()
        return future


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

    def last_turn(self) -> list[int]:
        """The token ids sampled in the latest turn."""
        return self.tokens[len(self.tokens) - self.turns[-1]["tokens"]:]


class EpisodeRunner:
    """Runs the episodes of a batch of data rows against fresh instances of `env_cls`."""

    def __init__(self, generator, tokenizer, env_cls: type, spec: str, limits: EpisodeLimits,
                 workers: int = 8):
        self.generator, self.tokenizer = generator, tokenizer
        self.env_cls, self.spec, self.limits = env_cls, spec, limits
        self.workers = workers
        self.entropy = True  # whether the generator reports per-token entropy (vllm does not)

    def run(self, rows: list[dict], prompt_ids: list[list[int]], n: int, params, rng) -> dict:
        """The rollout dict (`assembly.assemble_rollout`) of n episodes per row, plus the
        `episode` column: one record per row (`columns.EPISODE`)."""
        episodes, delta = self._start(rows, prompt_ids, n)
        pool = DaemonPool(self.workers)
        stepping: dict[Future, tuple[int, float, float]] = {}  # a running step -> (episode, generation s, submitted)
        ready = list(range(len(episodes)))
        try:
            while ready or stepping:
                if ready:
                    live = [episodes[i] for i in ready]
                    generate_s = self._generate_turn(live, params, rng)
                    for i, e in zip(ready, live):
                        future = pool.submit(self._timed_step, e, self._last_turn_text(e))
                        stepping[future] = (i, generate_s, time.monotonic())
                ready = self._collect(episodes, stepping, delta)
        finally:
            for future in stepping:  # an error ends the run: steps not yet started never start
                future.cancel()
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
                self._check_prompt(episodes[-1].prompt)
        return episodes, delta

    def _check_prompt(self, prompt: list[int]) -> None:
        limit = self.limits.max_prompt_tokens
        if limit is not None and len(prompt) > limit:
            raise UserError(f"rollout.env {self.spec!r}: reset() gave first messages of {len(prompt)} tokens, over "
                            f"data.max_prompt_length={limit}; raise data.max_prompt_length to at least {len(prompt)}")

    def _call(self, method, arg, name: str):
        try:
            result = method(arg)
            return asyncio.run(result) if inspect.isawaitable(result) else result
        except UserError:
            raise
        except Exception as err:
            raise UserError(f"rollout.env {self.spec!r}: {name}() raised "
                            f"{type(err).__name__}: {first_line(err)}") from err

    def _generate_turn(self, live: list[Episode], params, rng) -> float:
        """One sampled turn for every episode of `live`, appended to it; the seconds it took."""
        start = time.monotonic()
        per_turn = self.limits.max_turn_tokens or self.limits.max_tokens
        room = [min(per_turn, self.limits.max_tokens - len(e.tokens)) for e in live]
        out = self.generator.generate([e.prompt + e.tokens for e in live], 1,
                                      replace(params, max_new_tokens=max(1, *room)), rng)
        lengths = out[col.RESPONSE_MASK].sum(-1).tolist()
        entropy = out.get(col.ROLLOUT_ENTROPY)  # vllm reports none: the training engine recomputes it
        self.entropy = entropy is not None
        eos = {int(t) for t in getattr(self.generator, "eos", ())}
        for row, (e, length, own_room) in enumerate(zip(live, lengths, room)):
            length = min(length, own_room)  # every episode's turn is cut to its own room
            tokens = out[col.RESPONSES][row, :length].tolist()
            e.add(tokens, True, out[col.ROLLOUT_LOG_PROBS][row, :length].tolist(),
                  [0.0] * length if entropy is None else entropy[row, :length].tolist())
            # cut: the turn filled its room without ending (a call or an answer stopped mid-way)
            e.turns.append({"tokens": length, "cut": length >= own_room and (not tokens or tokens[-1] not in eos)})
        return time.monotonic() - start

    def _last_turn_text(self, e: Episode) -> str:
        return self.tokenizer.decode(e.last_turn(), skip_special_tokens=True)

    def _collect(self, episodes: list[Episode], stepping: dict, delta: ChatDelta) -> list[int]:
        """Wait for environment steps (see the module docstring) and apply the finished ones; the
        episodes that now wait for a turn, in episode order."""
        slowest = max(generate_s for _, generate_s, _ in stepping.values())
        done, _ = wait(stepping, timeout=max(STRAGGLER_MIN_S, STRAGGLER_SHARE * slowest))
        if not done:  # nobody is ready yet: wait for the first, or the nearest deadline
            deadline = min(episodes[i].started + self.limits.timeout_s for i, _, _ in stepping.values())
            done, _ = wait(stepping, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        ready = []
        for future in list(stepping):
            i, generate_s, submitted = stepping[future]
            e = episodes[i]
            if future in done:
                del stepping[future]
                if self._apply_step(e, *future.result(), delta, generate_s):
                    ready.append(i)
            elif time.monotonic() - e.started > self.limits.timeout_s:
                del stepping[future]  # its step is still running: the episode ends without it
                e.turns[-1].update(assistant=self._last_turn_text(e), observation=[], reward=0.0,
                                   generate_s=round(generate_s, 6), env_s=round(time.monotonic() - submitted, 6))
                e.ended = "timeout"
        return sorted(ready)

    def _apply_step(self, e: Episode, text: str, result, env_s: float, delta: ChatDelta, generate_s: float) -> bool:
        """The environment's answer to the episode's last turn; whether the episode goes on."""
        messages, reward, done = checked_step(result, self.spec)
        record = e.turns[-1]
        record.update(assistant=text, observation=messages, reward=reward,
                      generate_s=round(generate_s, 6), env_s=round(env_s, 6))
        if done:
            e.ended = "done"
        elif time.monotonic() - e.started > self.limits.timeout_s:
            e.ended = "timeout"
        elif len(e.turns) >= self.limits.max_turns:
            e.ended = "max_turns"
        else:
            ids = delta.observation_ids(messages, e.last_turn())
            if len(e.tokens) + len(ids) >= self.limits.max_tokens:
                e.ended = "max_tokens"  # no room for the observation and a turn after it
            else:
                e.add(ids, False)
        return not e.ended

    def _timed_step(self, episode: Episode, text: str):
        start = time.monotonic()
        result = self._call(episode.env.step, text, "step")
        return text, result, time.monotonic() - start

    def _assemble(self, episodes: list[Episode]) -> dict:
        lengths = torch.tensor([len(e.tokens) for e in episodes], dtype=torch.long)
        width = max(1, int(lengths.max()))

        def table(name: str, dtype, fill=0):
            out = torch.full((len(episodes), width), fill, dtype=dtype)
            for row, e in enumerate(episodes):
                out[row, :len(e.tokens)] = torch.tensor(getattr(e, name), dtype=dtype)
            return out

        per_token = {col.ROLLOUT_LOG_PROBS: table("log_probs", torch.float)}
        if self.entropy:
            per_token[col.ROLLOUT_ENTROPY] = table("entropy", torch.float)
        out = assemble_rollout([e.prompt for e in episodes], table("tokens", torch.long, self.generator.pad),
                               lengths, self.generator.pad, trained=table("trained", torch.long), **per_token)
        out[col.EPISODE] = [self._record(e) for e in episodes]
        return out

    def _record(self, e: Episode) -> dict:
        rewards = [t.get("reward", 0.0) for t in e.turns]
        return {"return": discounted_return(rewards, self.limits.discount), "turns": e.turns, "ended": e.ended,
                "tool_calls": getattr(e.env, "tool_calls", None)}
