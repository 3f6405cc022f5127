"""The reward and cost workers: score each response with a function or a sequence-classification model.

`RewardWorker` writes `scores` (N,) and the decoded `response_text`; `CostWorker` (Safe-RLHF)
writes `costs` (N,). Each uses its section's `model` when set, else its `function`.

A model scores prompt + response at its last token (`score_model.last_token_scores`). When
the model's tokenizer is the actor's, the rollout's token ids are scored as they are;
otherwise the prompt and response are decoded and re-tokenized with the model's own
tokenizer (chat prompts through its chat template), right-padded.
"""

from __future__ import annotations

import time

import torch

from hflow.engine import columns as col
from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import load_tokenizer, resolve_dtype
from hflow.engine.models.score_model import last_token_scores, load_score_model
from hflow.engine.padding import positions
from hflow.engine.specs import ScorerSpec
from hflow.engine.training.lockstep import agreed, several_ranks
from hflow.engine.training.zero3 import frozen_engine, is_partitioned, partitioned_load
from hflow.engine.workers.function_scores import call_scorer

# Columns the worker itself adds or reads; the rest go to the reward function.
_INTERNAL = {col.PROMPT_IDS, col.UID, col.PROMPT}


class RewardWorker(Worker):
    output_key = col.SCORES

    def __init__(self, spec: ScorerSpec, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = torch.device(device)
        self.fn = spec.fn
        self.tokenizer = None
        self.model = None
        self.model_tokenizer = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, checkpoint: str | None = None) -> None:
        """Load the actor's tokenizer and the scoring model, if any (`checkpoint` is unused: frozen)."""
        s = self.spec
        self.tokenizer = load_tokenizer(s.tokenizer.path, s.tokenizer.trust_remote_code)
        if s.model is not None:
            dtype = resolve_dtype(s.model.dtype, self.device)
            if s.zero_stage == 3:  # partitioned over the ranks like the actor (`training/zero3.py`)
                ensure_process_group(self.device, self.rank, self.world_size)
            with partitioned_load(s.zero_stage, dtype):
                model = load_score_model(s.model.path, dtype, s.model.trust_remote_code, what=f"{s.section}.model")
            if not is_partitioned(model):
                model.to(self.device)
            model.eval().requires_grad_(False)
            work_meter.attach(model, s.section)  # what its passes compute (`work_meter.py`)
            self.model = frozen_engine(model, s.zero_stage, dtype)
            own = load_tokenizer(s.model.path, s.model.trust_remote_code)
            self.model_tokenizer = None if own.get_vocab() == self.tokenizer.get_vocab() else own

    def _texts(self, batch: Batch) -> list[str]:
        return self.tokenizer.batch_decode(
            [row[mask.bool()].tolist() for row, mask in zip(batch[col.RESPONSES], batch[col.RESPONSE_MASK])],
            skip_special_tokens=True,
        )

    def _score(self, batch: Batch, texts: list[str]) -> torch.Tensor:
        if self.model is None:
            columns = {k: v for k, v in batch.columns.items() if k not in _INTERNAL}
            what = f"{self.spec.section}.function {self.spec.function!r}"
            return call_scorer(self.fn, what, batch[col.PROMPT], texts, columns, self.spec.timeout_s)
        inputs = self._model_inputs(batch, texts)
        micros = inputs.split(self.spec.micro_batch_size)
        forwards = len(micros)
        if self.spec.zero_stage == 3 and several_ranks():  # every rank runs as many forwards (lockstep.py)
            forwards = agreed(forwards, "max", self.device)
        out = []
        with torch.no_grad():
            for i in range(forwards):
                micro = (micros[i] if i < len(micros) else _one_token()).to(self.device)
                scores = self.model(micro[col.INPUT_IDS], micro[col.ATTENTION_MASK], micro[col.POSITION_IDS])
                if i < len(micros):
                    out.append(last_token_scores(scores, micro[col.ATTENTION_MASK]).float().cpu())
        return torch.cat(out)

    def _model_inputs(self, batch: Batch, texts: list[str]) -> Batch:
        if self.model_tokenizer is None:
            return batch.select(col.INPUT_IDS, col.ATTENTION_MASK, col.POSITION_IDS)
        tok = self.model_tokenizer
        rows = []
        for prompt, text in zip(batch[col.PROMPT], texts):
            if isinstance(prompt, list):
                chat = tok.apply_chat_template([*prompt, {"role": "assistant", "content": text}], tokenize=False)
                rows.append(tok(chat, add_special_tokens=False)[col.INPUT_IDS])
            else:
                rows.append(tok(str(prompt) + text)[col.INPUT_IDS])
        width = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), width), tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(rows):
            input_ids[i, :len(ids)] = torch.tensor(ids)
            mask[i, :len(ids)] = 1
        return Batch({col.INPUT_IDS: input_ids, col.ATTENTION_MASK: mask, col.POSITION_IDS: positions(mask)})

    @register(Dispatch.DP_COMPUTE)
    def compute_reward(self, batch: Batch) -> Batch:
        """`scores` (N,) and the decoded `response_text` of every row, and when this began
        (`reward_started_at`: a streamed step's rows show their reward overlapping generation)."""
        started = torch.full((len(batch),), time.time(), dtype=torch.float64)
        texts = self._texts(batch)
        return Batch({self.output_key: self._score(batch, texts), col.REWARD_STARTED_AT: started},
                     {col.RESPONSE_TEXT: texts})


def _one_token() -> Batch:
    """A forward's worth of input that only keeps a rank in step with the others (ZeRO-3)."""
    ids = torch.zeros(1, 1, dtype=torch.long)
    return Batch({col.INPUT_IDS: ids, col.ATTENTION_MASK: torch.ones_like(ids), col.POSITION_IDS: ids.clone()})


class CostWorker(RewardWorker):
    """Safe-RLHF's cost: `cost.model` or `cost.function`; positive means unsafe."""

    output_key = col.COSTS

    @register(Dispatch.DP_COMPUTE)
    def compute_cost(self, batch: Batch) -> Batch:
        """`costs` (N,) of every row."""
        return Batch({self.output_key: self._score(batch, self._texts(batch))})
