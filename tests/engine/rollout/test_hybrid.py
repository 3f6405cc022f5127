"""The hybrid engine's switch: no second copy of the weights appears on the way to rollout."""

import gc
import resource

import pytest
import torch

from hflow.engine.groups.batch import Batch
from hflow.engine.rollout.hybrid import resident_bytes
from hflow.trainer.control.placement import build_worker_groups
from hflow.trainer.config.load import build_recipe


def _status_kib(field: str) -> int:
    """A `kB` field of /proc/self/status (VmHWM, VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class PeakResident:
    """The peak resident memory of this process while the block ran, from the kernel's own
    high-water mark rather than from samples: a sampler that looks every millisecond misses a
    copy that appears and is freed between two looks, but the kernel raises the mark (VmHWM,
    the same counter getrusage's ru_maxrss reports) before it lets resident pages go, so no
    peak in the block can be missed (short of the kernel reclaiming pages under memory pressure).

    Writing 5 to /proc/self/clear_refs resets the mark to the current resident size (Linux >= 4.0,
    proc(5)), so the mark afterwards is this block's peak. Where that write is refused the mark
    is the lifetime peak: if it rose during the block it is the block's peak; if not, the block's
    peak is only bounded by an earlier one, and `peak` is that bound with `exact` False."""

    def __enter__(self):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.reset = True
        except OSError:
            self.reset = False
        self._lifetime_before = _maxrss_bytes()
        return self

    def __exit__(self, *exc):
        if self.reset:
            self.peak, self.exact = _status_kib("VmHWM") * 1024, True
        else:
            self.peak = _maxrss_bytes()
            self.exact = self.peak > self._lifetime_before


def test_peak_resident_sees_a_copy_freed_before_the_block_ends():
    gc.collect()  # earlier tests' garbage, freed during the block, would lower the peak seen from `before`
    before = resident_bytes()
    with PeakResident() as peak:
        copy = torch.ones(16 << 20)  # 64 MiB, every page written
        del copy  # gone again long before anyone could look
    if not peak.exact:
        pytest.skip("/proc/self/clear_refs refused and an earlier peak hides this one's")
    assert peak.peak - before >= 60 << 20, (peak.peak, before)
    assert resident_bytes() - before < 32 << 20  # it was freed: only the peak remembers it


@pytest.mark.slow
def test_switch_to_rollout_and_back_adds_no_weight_copy(tmp_path):
    from hflow.engine.models.loading import build_tiny_model

    model = build_tiny_model(tmp_path / "medium", "medium")
    recipe = build_recipe({
        "model": {"path": str(model)}, "data": {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"n": 2, "max_response_length": 4},
        "actor": {"zero_stage": 1, "micro_batch_size": 4, "mini_batch_size": 4},
        "trainer": {"prompts_per_step": 2},
    }, {}, "test")
    groups = build_worker_groups(recipe, ["actor"], torch.device("cpu"))
    worker = groups["actor"].worker
    groups["actor"].init_model()
    weight_bytes = sum(p.numel() * p.element_size() for p in worker.train_engine.module.parameters())
    assert weight_bytes > 100e6  # big enough that a copy stands far above allocator noise

    from hflow.engine.models.loading import load_tokenizer
    from hflow.trainer.data.prompts import PromptData

    prompts = PromptData(recipe.data, load_tokenizer(str(model)), 0, 2).batch(1)
    batch = groups["actor"].generate_sequences(prompts)
    batch |= groups["actor"].compute_log_prob(batch)
    batch |= Batch({"advantages": torch.ones(len(batch))})
    groups["actor"].update_actor(batch)  # training state (Adam moments) now exists

    before = resident_bytes()
    with PeakResident() as peak:  # train -> rollout (switch + a generation) -> train
        switch = groups["actor"].measure_switch()[0]
        groups["actor"].generate_sequences(prompts)
        worker.phases.to_train()
    growth = peak.peak - before
    if not peak.exact and growth >= weight_bytes / 2:
        pytest.skip("/proc/self/clear_refs refused and an earlier peak hides this one's: inconclusive")
    assert growth < weight_bytes / 2, (growth, weight_bytes)
    assert switch["training_state_bytes"] >= 3 * weight_bytes  # weights + fp32 masters + 2 Adam moments
    # The switch's time is a benchmark's business (`hflow bench switch`), not a test's.
    assert switch["to_rollout_s"] >= 0 and switch["to_train_s"] >= 0


class _RecordingTrainEngine:
    """Stands in for TrainEngine: records the offload calls PhaseSwitch makes (the offload itself
    is DeepSpeed's and needs a GPU)."""

    def __init__(self):
        self.module = torch.nn.Linear(2, 2)
        self.calls = []

    def offload_states(self):
        self.calls.append("offload")
        return ["optim_states"]

    def reload_states(self):
        self.calls.append("reload")


@pytest.mark.parametrize("offload", [False, True])
def test_offload_in_rollout_moves_the_training_state_out_and_back(offload):
    from hflow.engine.rollout.hybrid import PhaseSwitch

    engine = _RecordingTrainEngine()
    switch = PhaseSwitch(engine, torch.device("cpu"), offload=offload)
    switch.to_rollout()
    switch.to_rollout()  # already there: nothing moves twice
    assert switch.offloaded == (["optim_states"] if offload else [])
    switch.to_train()
    assert engine.calls == (["offload", "reload"] if offload else [])
    assert switch.offloaded == []
