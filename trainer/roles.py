"""What an algorithm is made of: its roles, the sections it trains, where its settings live, and
which of the run's modes its loop supports.

Each algorithm declares its row beside its recipe section (`config/algorithm_sections.py`,
`@algorithm(...)`); the recipe, the CLI and the registry read the rows from there. This module
imports nothing from hflow, so every floor of the trainer can import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    """One RL algorithm.

    name:        the recipe's `algorithm` value, and the name of its own recipe section.
    roles:       the roles it always runs, in the order its program unpacks them; the frozen
                 `reference` joins them when the recipe's KL coefficient is above 0.
    trained:     the recipe sections of the roles it optimises (an `OptimConfig` each).
    settings:    the recipe section holding its KL penalty and ratio clip (its own, or `ppo`).
    program:     the module whose `train(recipe, run)` runs it (imported by the registry).
    description: its recipe section's one line.
    no_async:    why `trainer.mode: async` cannot run it; None when its loop can (the critic-free
                 outcome loop, `algorithms/grpo.py: run_outcome_loop`).
    streams_updates: `trainer.stream_updates` may train its mini-batches before the step is whole
                 (its advantages use a mini-batch's own prompt groups only).
    """

    name: str
    roles: tuple[str, ...]
    trained: tuple[str, ...]
    settings: str
    program: str
    description: str = ""
    no_async: str | None = None
    streams_updates: bool = False

    def roles_for(self, uses_reference: bool) -> list[str]:
        """The roles a run starts: `roles`, plus `reference` when the KL term needs it."""
        return list(self.roles) + (["reference"] if uses_reference else [])
