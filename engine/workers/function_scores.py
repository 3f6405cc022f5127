"""Calling a user's reward or cost function, and checking what it returns.

A reward function is user code: whatever it raises, and any return that is not one real number
per response, is the user's to fix, so it ends the run with one line (a UserError) naming the
recipe key and the function, on the local and the ray backend alike. NaN and inf are numbers
here; the controller decides what a non-finite score does (`trainer.on_nonfinite`). One that
hangs is stopped by a watchdog (`watched_call.py`: on the local backend; on the ray backend the
controller's watches the whole call).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np
import torch

from hflow.engine.watched_call import watched
from hflow.errors import RunFailed, UserError, first_line


def call_scorer(fn: Callable[..., Any], what: str, prompts: list, responses: list[str],
                columns: dict[str, list], timeout_s: float | None = None) -> torch.Tensor:
    """`fn(prompts, responses, **columns)` as a float32 tensor (N,). `what` names the function
    in errors, e.g. "reward.function 'mod:fn'"; with `timeout_s`, a call that has not returned by
    then stops the run (`watched`)."""
    try:
        scores = watched(lambda: fn(prompts, responses, **columns), what, timeout_s)
    except RunFailed:  # the watchdog's: it hangs
        raise
    except Exception as err:  # the user's code: its traceback stays on the UserError's __cause__
        raise UserError(f"{what} raised {type(err).__name__}: {first_line(err)}") from err
    return checked_scores(scores, len(responses), what)


def checked_scores(scores: Any, n: int, what: str) -> torch.Tensor:
    """`scores` as a float32 tensor (n,) when it is a sequence of n real numbers (bools, ints,
    floats, numpy or torch scalars; a 1-D array or tensor), else a UserError saying what came back."""
    problem = _problem(scores, n)
    if problem:
        raise UserError(f"{what} returned {problem}; expected a list of {n} floats, one per response")
    return torch.tensor([float(s) for s in scores])


def _problem(scores: Any, n: int) -> str | None:
    """What is wrong with `scores`, in words, or None."""
    if scores is None:
        return "None"
    if isinstance(scores, (torch.Tensor, np.ndarray)):
        shape = tuple(scores.shape)
        if len(shape) != 1:
            return f"a {type(scores).__name__} of shape {shape}"
        if scores.dtype.is_complex if isinstance(scores, torch.Tensor) else np.iscomplexobj(scores):
            return f"a complex {type(scores).__name__}"
    elif isinstance(scores, (str, bytes, dict)) or not hasattr(scores, "__len__") or not hasattr(scores, "__iter__"):
        return _describe(scores)
    if len(scores) != n:
        return f"{len(scores)} scores for {n} responses"
    for i, value in enumerate(scores):
        if not _is_real(value):
            return f"a {type(scores).__name__} whose element {i} is {_describe(value)}"
    return None


def _is_real(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.dtype.is_complex
    return isinstance(value, (numbers.Real, np.bool_))


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({text})"
