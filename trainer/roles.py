"""What each algorithm is made of: its roles, the sections it trains, where its settings live.

The one table the recipe (`config/recipe.py`), the algorithm programs and the registry
read. It imports nothing from hflow, so the recipe can import it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One RL algorithm.

    name:     the recipe's `algorithm` value.
    roles:    the roles it always runs, in the order its program unpacks them; the
              frozen `reference` joins them when the recipe's KL coefficient is above 0.
    trained:  the recipe sections of the roles it optimises (an `OptimConfig` each).
    settings: the recipe section holding its KL penalty and ratio clip.
    program:  the module whose `train(recipe, run)` runs it (imported by the registry).
    """

    name: str
    roles: tuple[str, ...]
    trained: tuple[str, ...]
    settings: str
    program: str

    def roles_for(self, uses_reference: bool) -> list[str]:
        """The roles a run starts: `roles`, plus `reference` when the KL term needs it."""
        return list(self.roles) + (["reference"] if uses_reference else [])


_PROGRAMS = "hflow.trainer.algorithms."

ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("grpo", ("actor", "reward"), ("actor",), "grpo", _PROGRAMS + "grpo"),
        Algorithm("ppo", ("actor", "critic", "reward"), ("actor", "critic"), "ppo", _PROGRAMS + "ppo"),
        Algorithm("remax", ("actor", "reward"), ("actor",), "remax", _PROGRAMS + "remax"),
        Algorithm("safe_rlhf", ("actor", "critic", "cost_critic", "reward", "cost"), ("actor", "critic"),
                  "ppo", _PROGRAMS + "safe_rlhf"),
        Algorithm("rloo", ("actor", "reward"), ("actor",), "rloo", _PROGRAMS + "rloo"),
        Algorithm("reinforce_pp", ("actor", "reward"), ("actor",), "reinforce_pp", _PROGRAMS + "reinforce_pp"),
        Algorithm("reinforce_pp_baseline", ("actor", "reward"), ("actor",), "reinforce_pp_baseline",
                  _PROGRAMS + "reinforce_pp"),
        Algorithm("dapo", ("actor", "reward"), ("actor",), "dapo", _PROGRAMS + "dapo"),
        Algorithm("gspo", ("actor", "reward"), ("actor",), "gspo", _PROGRAMS + "grpo"),  # GRPO's loop, GSPO's loss
    )
}
