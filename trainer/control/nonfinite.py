"""NaN and inf in a step: scores the controller refuses or skips, updates that diverged.

A non-finite reward or cost would turn the advantages, then the loss, then the weights into
NaN. The controller looks at the scores before any update (`Session.finite_scores`):
`trainer.on_nonfinite: error` stops the run naming the scorer, `skip_step` skips the step's
updates. A non-finite loss or gradient norm is found after the update, in the metrics the
workers return: the weights are already changed, so it always stops the run, before the step
is logged or checkpointed (the last checkpoint stays the last good one).

The update is checked on the controller rather than inside the worker: every rank's metrics
arrive there (a worker that raised mid-update while its data-parallel peers wait in a
collective would hang them), and one check covers the actor, the critic and the cost critic.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hflow.errors import RunFailed

SKIPPED = "nonfinite/skipped_steps"


def scorer_name(recipe, section: str) -> str:
    """The recipe key and value of a reward or cost, as errors name it: reward.function 'mod:fn'."""
    cfg = getattr(recipe, section)
    return f"{section}.model {cfg.model!r}" if cfg.model else f"{section}.function {cfg.function!r}"


def nonfinite_problem(values: torch.Tensor, what: str, step: int) -> str | None:
    """'returned 1 non-finite score of 64 at step 3 (nan)' for `values` (N,) with NaN or inf, else None."""
    bad = ~torch.isfinite(values)
    count = int(bad.sum())
    if not count:
        return None
    kinds = sorted({str(float(v)) for v in values[bad]})
    plural = "s" if count > 1 else ""
    return f"returned {count} non-finite {what}{plural} of {len(values)} at step {step} ({', '.join(kinds)})"


def finite(values: torch.Tensor) -> torch.Tensor:
    """The finite entries of `values` (`values` itself when all are: the same numbers as before)."""
    ok = torch.isfinite(values)
    return values if bool(ok.all()) else values[ok]


def check_update(step: int, metrics: dict[str, Any]) -> None:
    """RunFailed when a role's loss or gradient norm in `metrics` is NaN or inf."""
    bad = {k: v for k, v in metrics.items() if k.endswith(("loss", "grad_norm"))
           and isinstance(v, (int, float)) and not math.isfinite(v)}
    if bad:
        role = next(iter(bad)).split("/")[0]
        values = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise RunFailed(f"the {role} update diverged at step {step} ({values}); the step is neither logged nor "
                        f"saved (a lower {role.replace('cost_', '')}.lr, or rewards of a smaller scale, may help)")
