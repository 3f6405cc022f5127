"""The work meter counts exactly what a forward computed: body tokens, attention keys and head
positions of known passes through the tiny model, a backward where gradients are on, the phase
of the worker method running, and generation's lean decoding path, finished rows included."""

import pytest
import torch

from hflow.engine import work_meter
from hflow.engine.groups.batch import Batch
from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.worker import Worker
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.models.score_model import load_score_model
from hflow.engine.rollout.generation import HFGenerator, SamplingParams


@pytest.fixture
def model(tiny_model):
    model = load_causal_lm(str(tiny_model), torch.float32)
    work_meter.attach(model, "actor")
    work_meter.take()  # nothing left over from another test
    return model


def _ids(rows, positions):
    return torch.randint(3, 50, (rows, positions), generator=torch.Generator().manual_seed(0))


def _counts(phase="other", label="actor"):
    return work_meter.take().get(phase, {}).get(label)


def test_a_forward_counts_its_rows_positions_keys_and_kept_logits(model):
    with torch.no_grad():
        model(input_ids=_ids(3, 5), logits_to_keep=2)
    # 3 rows x 5 positions; position p attends to p + 1 keys: 3 x (1 + 2 + 3 + 4 + 5) = 45
    assert _counts() == {"tokens": 15, "keys": 45, "logits": 6,  # the head on 2 positions of 3 rows
                         "backward_tokens": 0, "backward_keys": 0, "backward_logits": 0}


def test_a_forward_with_gradients_counts_its_backward_and_a_checkpointed_recompute(model):
    model(input_ids=_ids(2, 4))
    assert _counts() == {"tokens": 8, "keys": 20, "logits": 8, "backward_tokens": 8, "backward_keys": 20,
                         "backward_logits": 8}
    model.gradient_checkpointing_enable()
    model.train()
    model(input_ids=_ids(2, 4))
    counts = _counts()  # the body runs forward twice (once more inside the backward), the head once
    assert (counts["tokens"], counts["keys"], counts["logits"]) == (16, 40, 8)
    assert (counts["backward_tokens"], counts["backward_logits"]) == (8, 8)


def test_a_forward_on_a_cache_attends_to_the_cached_positions(model):
    with torch.no_grad():
        prefix = model(input_ids=_ids(2, 3), use_cache=True)
        model(input_ids=_ids(2, 2), past_key_values=prefix.past_key_values, use_cache=True)
    # prefix: 2 x (1 + 2 + 3) = 12; then 2 rows x 2 positions after 3 cached: 2 x (4 + 5) = 18
    assert _counts()["keys"] == 12 + 18


def test_a_score_model_counts_its_scalar_head(tiny_model):
    scorer = load_score_model(str(tiny_model), torch.float32)
    work_meter.attach(scorer, "critic")
    work_meter.take()
    with torch.no_grad():
        scorer(_ids(2, 6), torch.ones(2, 6, dtype=torch.long))
    counts = _counts(label="critic")
    assert (counts["tokens"], counts["logits"]) == (12, 12)  # every position scored


class _Phases(Worker):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def _forward(self, batch: Batch, rows: int):
        with torch.no_grad():
            self.model(input_ids=_ids(rows, 2), logits_to_keep=1)

    @register(Dispatch.DP_COMPUTE)
    def generate_sequences(self, batch: Batch):
        self._forward(batch, 1)

    @register(Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch):
        self._forward(batch, 2)

    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch):
        self.model(input_ids=_ids(3, 2))


def test_work_counts_under_the_worker_method_running(model):
    worker = _Phases(model)
    worker.generate_sequences(Batch({"x": torch.zeros(1)}))
    worker.compute_log_prob(Batch({"x": torch.zeros(1)}))
    worker.update_actor(Batch({"x": torch.zeros(1)}))
    worker.generate_sequences(Batch({"x": torch.zeros(1)}, meta={"eval": {"n": 1}}))
    with torch.no_grad():
        model(input_ids=_ids(1, 1))  # outside any worker method
    counts = worker.take_work()
    tokens = {phase: labels["actor"]["tokens"] for phase, labels in counts.items()}
    assert tokens == {"generate": 2, "old_log_prob": 4, "update_actor": 6, "eval": 2, "other": 1}
    assert counts["update_actor"]["actor"]["backward_tokens"] == 6
    assert work_meter.take() == {}  # taken: counting starts again from zero


def _decode_rows(lengths: list[int], max_new: int, at_once: bool) -> list[int]:
    """Rows fed to each decoding step, as the hf engine runs them: a finished row leaves the batch
    at once (the lean step below 12 rows, `at_once`) or stays, fed padding, until the finished rows
    are a quarter of it (the plain forward's `ForwardDecoder.batch_rows`)."""
    batch, fed = list(range(len(lengths))), []
    for t in range(max_new):
        done = {row for row in batch if lengths[row] <= t + 1}
        if t + 1 == max_new or done == set(batch):
            return fed
        if done and (at_once or len(done) * 4 >= len(batch)):
            batch = [row for row in batch if row not in done]
        fed.append(len(batch))
    return fed


@pytest.mark.parametrize("fast", [True, False])
def test_generation_counts_every_decoding_step_of_every_row_in_the_batch(model, fast):
    """The lean decoding step (fast_decode.py) calls the embedding itself: it counts as the plain
    forward does. It drops a finished row at once: computed = needed; the plain forward keeps
    finished rows until they are a quarter of the batch, and they are counted (real waste)."""
    prompts, n, max_new = [[5, 6, 7], [8, 9]], 4, 8
    eos = [9]  # with this seed one row of the random tiny model ends early (at 5 tokens of 8)
    generator = HFGenerator(model, eos, 0, batch_size=64, fast=fast)
    assert generator.fast is fast
    with work_meter.working_on("generate"):
        out = generator.generate(prompts, n, SamplingParams(max_new), torch.Generator().manual_seed(0))
    lengths = out["response_mask"].sum(-1).tolist()
    fed = _decode_rows(lengths, max_new, at_once=fast)
    counts = _counts("generate")
    # One prefill per prompt (2 x 3 columns, the shorter left-padded), then one position per row per step.
    assert counts["tokens"] == 2 * 3 + sum(fed)
    assert counts["logits"] == 2 + sum(fed)  # the prefill's last position, then every decoding step
    # each decoding step k attends to the 3 prompt columns and k + 1 generated ones
    assert counts["keys"] == 2 * (1 + 2 + 3) + sum(rows * (3 + k + 1) for k, rows in enumerate(fed))
    assert min(lengths) < max(lengths)  # some rows ended early ...
    needed = sum(max(0, r - 1) for r in lengths)
    if fast:  # ... and left the batch at once: no step of a finished row
        assert sum(fed) == needed
    else:  # ... and their steps in the batch show as waste
        assert sum(fed) > needed
