"""GRPO as a single-controller program (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

Each step samples n responses per prompt, scores them, normalises the scores within
each prompt's group, and takes PPO-clip steps on the policy, with a KL term to the
frozen reference. There is no critic. GSPO (`gspo:`) runs this same program: its
advantages are GRPO's, and its actor takes a sequence-level ratio (`gspo.policy_loss: gspo`).
Any registered policy loss (`engine/rlmath/policy_losses.py`) runs in this loop through
`grpo.policy_loss`, e.g. CISPO's (`recipes/cispo/tiny.yaml`).
RLOO and REINFORCE++ run the loop (`run_outcome_loop`) with their own advantages.
"""

from __future__ import annotations

from typing import Callable

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.worker import resolve
from hflow.engine.rlmath import advantages
from hflow.engine.rlmath.kl import kl_in_reward
from hflow.trainer.config.recipe import Recipe
from hflow.trainer.streaming.async_rollout import rollouts
from hflow.trainer.control.session import Session
from hflow.trainer.streaming.streamed_update import train_streamed
from hflow.trainer.rundir.writer import RunDir


def train(recipe: Recipe, run: RunDir) -> None:
    run_outcome_loop(recipe, run, compute_advantages)


def run_outcome_loop(recipe: Recipe, run: RunDir, compute: Callable[[Batch, Recipe], Batch]) -> None:
    """Generate, score, `compute` the advantages, update the actor: the loop of the critic-free
    algorithms with one reward per response (GRPO, GSPO, RLOO, REINFORCE++). With `trainer.mode:
    async` the rollouts come from a generator running ahead (`streaming/async_rollout.py`), and with
    `trainer.stream_updates` each mini-batch trains as soon as it is scored (`streaming/streamed_update.py`)."""
    roles = recipe.algorithm_spec.roles_for(recipe.uses_reference)
    with Session(recipe, run, roles) as session:
        session.init_workers()
        actor, reward = session.groups["actor"], session.groups["reward"]

        with rollouts(session) as rollout:
            for step in session.steps():
                if recipe.trainer.stream_updates:  # each mini-batch trains as it completes
                    batch, metrics, streamed = train_streamed(session, rollout.chunks(step), reward, compute, step)
                    rollout.trained(step)
                    session.end_step(step, batch, metrics, streamed, rollout.metrics())
                    continue
                # Generation, reference and reward stream chunk by chunk (`streaming/chunks.py`).
                batch, streamed = session.score_stream(rollout.chunks(step), reward)
                batch = session.old_log_probs(batch)
                if not session.finite_scores(batch, step):  # a NaN/inf score, trainer.on_nonfinite: skip_step
                    rollout.trained(step)
                    session.end_step(step, batch, streamed, rollout.metrics())  # logged, with no update
                    continue
                with session.stage("advantage"):
                    batch |= compute(batch, recipe)
                with session.stage("update_actor"):
                    # Waited for here (on ray it is a future): async mode's refresh, next, would
                    # otherwise wait for it and count the update as the trainer's idle time.
                    metrics = resolve(actor.update_actor(batch))
                rollout.trained(step)  # async: the generator copy gets the new weights
                session.end_step(step, batch, metrics, streamed, rollout.metrics())
        session.finish()


def compute_advantages(batch: Batch, recipe: Recipe) -> Batch:
    """Group-normalised sequence scores; with `kl_in_reward`, the summed KL is charged first."""
    g = getattr(recipe, recipe.algorithm_spec.settings)  # `grpo:`, or `gspo:` / `dapo:` (same keys)
    scores = kl_charged_scores(batch, recipe)
    adv = advantages.grpo(scores, batch[col.UID], eps=g.eps, scale_by_std=g.scale_by_std)
    return Batch({col.ADVANTAGES: adv})


def kl_charged_scores(batch: Batch, recipe: Recipe):
    """(B,) scores, less kl_coef x the response's summed KL to the reference when the algorithm
    charges the KL in the reward (`kl_in_reward`) and a reference ran."""
    scores = batch[col.SCORES].float()
    kl = kl_in_reward(batch, recipe.kl)
    if kl is not None:
        scores = scores - recipe.kl.coef * (kl * batch[col.RESPONSE_MASK]).sum(-1)
    return scores
