"""The recipe's `eval` section: how `data.eval` is sampled, and the named held-out sets of
`eval.sets`, each with its own prompts, template, length limit and answer extraction
(`trainer/control/evaluate.py` runs them; `hflow eval` and `trainer.eval_every` report them)."""

from __future__ import annotations

import re
from typing import Optional

from pydantic import Field, field_validator, model_validator

from hflow.trainer.config.sections import Section

SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Names of data.eval's own metrics (eval/accuracy, ...): a set so named would read as one of them.
RESERVED = {"reward", "accuracy", "response_length", "cutoff_share", "tool_call_share"}
# What counts as right (`trainer/data/answers.py` extracts the answers).
RULES = ("reward", "last_number", "boxed", "exact", "regex:PATTERN")


def check_rule(rule: str) -> str | None:
    """Why `rule` is not an extraction rule, or None when it is one."""
    if rule.startswith("regex:"):
        try:
            re.compile(rule[len("regex:"):])
        except re.error as err:
            return f"extract {rule!r}: the pattern does not compile ({err})"
        return None
    if rule not in RULES[:-1]:
        return f"extract {rule!r}: accepted: {', '.join(RULES)}"
    return None


class EvalSet(Section):
    """One held-out set: its metrics are eval/<name>/accuracy (greedy), eval/<name>/mean@k and
    eval/<name>/pass@k (k sampled responses per prompt, when k > 1), eval/<name>/response_length
    and eval/<name>/cutoff_share (greedy responses stopped by the length limit)."""

    name: str = Field(description="The set's name in its metrics: eval/<name>/accuracy.")
    data: str = Field(
        description="Its prompts: a .jsonl or .parquet file, or `synthetic:TASK` for a task's held-out problems "
        "(arithmetic: `synthetic:arithmetic`, `synthetic:arithmetic_rephrased` with instructions never trained "
        "on, `synthetic:arithmetic_wide` with operands outside the training ranges; multiply: "
        "`synthetic:multiply_wide`, three-digit times two-digit)."
    )
    size: Optional[int] = Field(
        None, gt=0, description="Prompts used: a `synthetic:` set draws this many (default 128); a file keeps its "
        "first this many rows (default: all).")
    prompt_key: str = Field("prompt", description="The file's prompt column (unused with a template).")
    template: Optional[str] = Field(
        None, description="The prompt, built from the row's columns: Python format fields, e.g. "
        "'Question: {question}\\nGive the number only.'; unset: the prompt column as it is.")
    chat: bool = Field(
        True, description="With a template: send the prompt as one user message through the model's chat "
        "template (false: plain text).")
    max_response_length: Optional[int] = Field(
        None, gt=0, description="Most new tokens per response; default: eval.max_response_length, else "
        "rollout.max_response_length.")
    extract: str = Field(
        "reward", description="What counts as right. `reward`: the recipe's reward is >= 1. Else the answer "
        "extracted from the response equals the row's answer column (numbers compared as numbers): "
        "`last_number` (what follows '####', else the last number), `boxed` (the last \\boxed{...}), `exact` "
        "(the whole response, stripped), `regex:PATTERN` (the first group of the pattern's last match).")
    answer_key: str = Field("answer", description="The column holding the right answer (extract other than reward).")
    k: int = Field(1, ge=1, description="Above 1: also k sampled responses per prompt, for mean@k and pass@k.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the k sampled responses.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not SET_NAME.fullmatch(value) or value in RESERVED or "@" in value:
            raise ValueError(f"eval set name {value!r}: letters, digits, '_', '-' and '.', not one of "
                             f"{', '.join(sorted(RESERVED))} (data.eval's own metrics)")
        return value

    @field_validator("extract")
    @classmethod
    def _extract(cls, value: str) -> str:
        problem = check_rule(value)
        if problem:
            raise ValueError(problem)
        return value


class EvalConfig(Section):
    """How evaluation samples (`data.eval`, `trainer.eval_every`, `hflow eval`), and further sets."""

    n: int = Field(
        1, ge=1, description="Responses per data.eval prompt; above 1, eval/pass@n is logged as well."
    )
    temperature: float = Field(
        0.0, ge=0, description="Sampling temperature of data.eval's responses; 0 is greedy decoding."
    )
    max_response_length: Optional[int] = Field(
        None, gt=0, description="Most new tokens per eval response; default: rollout.max_response_length."
    )
    batch_size: Optional[int] = Field(
        None, gt=0, description="Sequences the hf engine decodes together in an evaluation (whole prompt groups): "
        "more rows per decoding step use the matrix products better, for a larger KV cache (counted in the "
        "memory check). Default: rollout.batch_size. vllm batches by itself.")
    sets: list[EvalSet] = Field(
        default_factory=list, description="Further held-out sets, each reported under eval/<name>/ (see EvalSet's "
        "keys below); evaluated with data.eval at step 0, every trainer.eval_every steps, at the last step and "
        "by `hflow eval`.")

    @model_validator(mode="after")
    def _distinct(self) -> "EvalConfig":
        names = [s.name for s in self.sets]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"eval.sets: the name {twice[0]!r} is used twice; each set needs its own name")
        return self

    def response_limit(self, rollout_limit: int, held_out: EvalSet | None = None) -> int:
        """Most new tokens per response of data.eval (`held_out` None) or of a set: its own limit,
        else eval.max_response_length, else the rollout's."""
        own = held_out.max_response_length if held_out is not None else None
        return own or self.max_response_length or rollout_limit
