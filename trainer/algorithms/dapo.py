"""DAPO as a single-controller program (Yu et al. 2025, arXiv 2503.14476).

GRPO with four changes (the paper's Sec. 3): clip-higher (`dapo.clip_high`, 0.28), a
token-mean loss (`dapo.loss_agg_mode`), dynamic sampling and overlong reward shaping.

Dynamic sampling: a prompt whose n rewards are all equal has zero advantage everywhere,
so it is dropped, and more prompts are generated (reading on in the prompt stream) until
the step holds `trainer.prompts_per_step` prompts with varied rewards, or until
`dapo.max_sampling_rounds` rounds are spent. Then the step is filled up with dropped
prompts so that its size, and so every mini-batch and data-parallel split, stays what
the recipe says: their advantages are 0, so the policy gradient comes from the varied
prompts only (verl instead keeps generating or stops with an error; OpenRLHF trains on
a short batch). Each step logs dapo/sampling_rounds, dapo/dropped_groups (prompts seen
with equal rewards) and dapo/filled_groups (those trained on to fill the step).
The position in the prompt stream is kept in checkpoints, so `--resume` is exact.
"""

from __future__ import annotations

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import resolve
from hflow.engine.models.loading import load_tokenizer
from hflow.engine.padding import pad_rollout
from hflow.engine.rlmath.dapo import overlong_penalty, varied_groups
from hflow.trainer.algorithms.grpo import compute_advantages
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.control.session import Session
from hflow.trainer.rundir.writer import RunDir


class PromptCursor:
    """The next position of the prompt stream to read (saved with every checkpoint)."""

    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def train(recipe: Recipe, run: RunDir) -> None:
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor = session.groups["actor"]
        cursor = session.track("dapo_prompts", PromptCursor())
        pad = load_tokenizer(recipe.model.path, recipe.model.trust_remote_code).pad_token_id or 0

        for step in session.steps():
            batch, sampling = sample_step(session, cursor, step, pad)
            batch = session.old_log_probs(batch)
            batch = session.reference_log_probs(batch)
            if not session.finite_scores(batch, step):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                session.end_step(step, batch, sampling)  # logged, with no update
                continue
            with session.stage("advantage"):
                batch |= compute_advantages(batch, recipe)
            with session.stage("update_actor"):
                metrics = actor.update_actor(batch)
            session.end_step(step, batch, metrics, sampling)
        session.finish()


def sample_step(session: Session, cursor: PromptCursor, step: int, pad: int) -> tuple[Batch, dict[str, float]]:
    """The step's scored rollout: one round without dynamic sampling; with it, rounds until
    `prompts_per_step` varied groups or `max_sampling_rounds` (see the module docstring)."""
    recipe, d = session.recipe, session.recipe.dapo
    want = recipe.trainer.prompts_per_step
    kept: list[Batch] = []
    dropped: list[Batch] = []
    penalties: list[float] = []
    rounds = 0
    while rounds < (d.max_sampling_rounds if d.dynamic_sampling else 1):
        batch = scored_round(session, cursor, step, rounds)
        penalties.append(float(batch[col.OVERLONG_PENALTY].mean()))
        rounds += 1
        if not d.dynamic_sampling:
            return batch, {"dapo/overlong_penalty_mean": penalties[0]}
        varied, equal = varied_groups(batch[col.SCORES], batch[col.UID])
        kept += [batch.index(rows) for rows in varied]
        dropped += [batch.index(rows) for rows in equal]
        if len(kept) >= want:
            break
    filled = dropped[: max(0, want - len(kept))]
    metrics = {"dapo/sampling_rounds": float(rounds), "dapo/dropped_groups": float(len(dropped)),
               "dapo/filled_groups": float(len(filled)),
               "dapo/overlong_penalty_mean": sum(penalties) / len(penalties)}
    return concat_padded(kept[:want] + filled, pad), metrics


def scored_round(session: Session, cursor: PromptCursor, step: int, round_: int) -> Batch:
    """One round: the next `prompts_per_step` prompts, generated and scored, with DAPO's overlong
    penalty (eq. 13) added to each score (the column `overlong_penalty` keeps it)."""
    recipe, d = session.recipe, session.recipe.dapo
    prompts = session.data.batch_at(cursor.position, step)
    cursor.position += recipe.trainer.prompts_per_step
    prompts.meta["round"] = round_  # each round samples from its own random stream
    with session.stage("generate"):
        batch = session.groups["actor"].generate_sequences(prompts)
    with session.stage("reward"):
        batch = resolve(batch | session.groups["reward"].compute_reward(batch))
    lengths = batch[col.RESPONSE_MASK].sum(-1)
    penalty = overlong_penalty(lengths, recipe.rollout.max_response_length, d.overlong_buffer, d.overlong_penalty)
    batch.tensors[col.SCORES] = batch[col.SCORES].float() + penalty
    batch.tensors[col.OVERLONG_PENALTY] = penalty
    return batch


def concat_padded(pieces: list[Batch], pad: int) -> Batch:
    """Groups from different rounds (whose prompt and response widths may differ) as one batch."""
    width_r = max(p[col.RESPONSE_MASK].shape[1] for p in pieces)
    width_p = max(p[col.ATTENTION_MASK].shape[1] - p[col.RESPONSE_MASK].shape[1] for p in pieces)
    padded = [Batch(pad_rollout(dict(p.tensors), width_p, width_r, pad), p.columns, p.meta) for p in pieces]
    return Batch.concat(padded)
