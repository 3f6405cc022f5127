"""Checkpoints of the DeepSpeed engine: save -> load -> next update equals the uninterrupted one,
in every ZeRO stage, in fp32 and bf16 (whose ZeRO-0 and ZeRO-1 run different DeepSpeed optimizer
wrappers: `master_state.py`), also after the rollout's offload -> reload of the training state."""

import weakref

import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_same_adam_step

from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training.master_state import MOMENTS, MasterState
from hflow.engine.training.train_engine import TrainEngine, deepspeed_config, lr_lambda
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.placement.worker_specs import optim_spec

WRAPPERS = {(0, "float32"): "AdamW", (0, "bfloat16"): "FP16_UnfusedOptimizer",
            (1, "float32"): "DeepSpeedZeroOptimizer", (1, "bfloat16"): "BF16_Optimizer",
            (2, "float32"): "DeepSpeedZeroOptimizer", (2, "bfloat16"): "DeepSpeedZeroOptimizer",
            (3, "float32"): "DeepSpeedZeroOptimizer_Stage3", (3, "bfloat16"): "DeepSpeedZeroOptimizer_Stage3"}


def _update(engine, ids):
    out = engine.forward(input_ids=ids, labels=ids)
    engine.backward(out.loss)
    return engine.step()


def _engine(tiny_model, cfg, dtype="float32"):
    model = load_causal_lm(str(tiny_model), torch.float32).to(getattr(torch, dtype))
    return TrainEngine(model, optim_spec(cfg), total_updates=10, micro_batch_size=4, micro_steps=1,
                       bf16=dtype == "bfloat16")


def _states(engine):
    return {(name, key): engine._full_state(p, key).clone()
            for name, p in engine._named_params() for key in ("param", *MOMENTS)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_resume_continues_exactly(tiny_model, tmp_path, stage, dtype):
    ensure_process_group(torch.device("cpu"))
    cfg = ActorConfig(lr=1e-2, zero_stage=stage, warmup_steps=2, lr_schedule="cosine")
    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    first = _engine(tiny_model, cfg, dtype)
    assert type(first.optimizer).__name__ == WRAPPERS[stage, dtype]
    _update(first, ids)
    _update(first, ids)
    # A rollout between updates moves the training state off the device and back (on a GPU;
    # here DeepSpeed's bookkeeping runs the same on CPU tensors), then a checkpoint is written.
    first.move_states()
    first.restore_states()
    first.save(tmp_path / "ckpt")
    saved = _states(first)
    norm_a = _update(first, ids)

    # A fresh engine from the initial weights: everything trained comes from the checkpoint.
    second = _engine(tiny_model, cfg, dtype)
    second.load(tmp_path / "ckpt")
    assert second.updates == 2 and second.lr == pytest.approx(first_lr_at(cfg, 2))
    for key, value in _states(second).items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=0, msg=str(key))
    norm_b = _update(second, ids)
    assert norm_b == pytest.approx(norm_a, rel=1e-6)
    for (name, a), (_, b) in zip(first._named_params(), second._named_params()):
        torch.testing.assert_close(first._full_state(a, "param"), second._full_state(b, "param"),
                                   rtol=0, atol=0, msg=name)
        if stage != 3:  # the module's own (bf16) weights too; ZeRO-3's are partitioned
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0, msg=name)


def test_saved_files_are_safetensors_with_the_full_fp32_state(tiny_model, tmp_path):
    ensure_process_group(torch.device("cpu"))
    engine = _engine(tiny_model, ActorConfig(lr=1e-2, zero_stage=2), "bfloat16")
    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    _update(engine, ids)
    engine.save(tmp_path / "ckpt")
    weights = load_file(tmp_path / "ckpt" / "weights.safetensors")
    moments = load_file(tmp_path / "ckpt" / "optimizer.safetensors")
    named = engine._named_params()
    assert list(weights) and set(weights) == {n for n, _ in named}
    assert set(moments) == {f"{k}/{n}" for n, _ in named for k in MOMENTS}
    for name, p in named:
        assert weights[name].dtype == torch.float32 and weights[name].shape == p.shape
        torch.testing.assert_close(weights[name], engine._full_state(p, "param"), rtol=0, atol=0)
        torch.testing.assert_close(moments[f"exp_avg/{name}"], engine._full_state(p, "exp_avg"), rtol=0, atol=0)


@pytest.mark.parametrize("stage", [0, 2])
def test_save_holds_one_gathered_tensor_at_a_time(tiny_model, tmp_path, monkeypatch, stage):
    """Every full tensor the save gathers is gone before the next is gathered: a rank's host memory
    for a checkpoint is one tensor, not the model's fp32 weights and moments (as with save_file)."""
    ensure_process_group(torch.device("cpu"))
    engine = _engine(tiny_model, ActorConfig(lr=1e-2, zero_stage=stage), "bfloat16")
    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    _update(engine, ids)
    alive: weakref.WeakSet = weakref.WeakSet()
    most = []
    get = MasterState.get

    def counting(self, param, key):
        # A copy stands for what the gather returns; the master itself stays alive regardless.
        full = get(self, param, key).clone()
        most.append(len(alive))
        alive.add(full)
        return full

    monkeypatch.setattr(MasterState, "get", counting)
    engine.save(tmp_path / "ckpt")
    assert len(most) == 3 * len(engine._named_params())
    assert max(most) == 0  # nothing gathered earlier is still held when the next gather starts


def test_bf16_gradients_accumulate_in_fp32_under_zero_1_and_2():
    for stage in (1, 2):
        assert deepspeed_config(stage, 1.0, 4, 2, bf16=True)["data_types"] == {"grad_accum_dtype": "fp32"}
    # DeepSpeed refuses fp32 accumulation of bf16 weights without ZeRO; fp32 weights need nothing.
    assert "data_types" not in deepspeed_config(0, 1.0, 4, 2, bf16=True)
    assert "data_types" not in deepspeed_config(2, 1.0, 4, 2, bf16=False)


@pytest.mark.parametrize("stage, dtype", [(0, "float32"), (0, "bfloat16"), (1, "bfloat16"), (2, "bfloat16"),
                                          (2, "float32")])
def test_a_gradient_written_before_an_earlier_forwards_outputs_are_reached_reaches_the_update(tiny_model, stage,
                                                                                              dtype):
    """Two forwards, then the LM head over both forwards' hidden states, outside either (as a trial
    ran it once over a shared prompt and its buckets): the head's gradient is written
    before the backward reaches the first forward's outputs, where DeepSpeed runs its backward
    prologue again; bf16 ZeRO-1's cleared the gradients written so far, and the head's step was
    weight decay alone."""
    ensure_process_group(torch.device("cpu"))
    lr = 1e-2
    engine = _engine(tiny_model, ActorConfig(lr=lr, zero_stage=stage), dtype)
    head = engine.module.get_output_embeddings()
    ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    hidden = [engine.forward(input_ids=row[None], output_hidden_states=True).hidden_states[-1] for row in ids]
    before = head.weight.detach().float().clone()
    engine.backward(head(torch.cat(hidden)).float().logsumexp(-1).mean())
    engine.step()
    # Adam's first step moves every weight with a gradient by about the learning rate.
    assert float((head.weight.detach().float() - before).abs().max()) > lr / 2


def first_lr_at(cfg, step):
    return cfg.lr * lr_lambda(optim_spec(cfg), 10)(step)


def test_lr_schedule_shapes():
    cfg = ActorConfig(lr=1.0, warmup_steps=2, lr_schedule="linear", min_lr_ratio=0.1)
    f = lr_lambda(optim_spec(cfg), 12)
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == pytest.approx(1.0) and f(7) == pytest.approx(0.1 + 0.9 * 0.5) and f(12) == pytest.approx(0.1)
    cos = lr_lambda(optim_spec(ActorConfig(lr=1.0, lr_schedule="cosine")), 10)
    assert cos(5) == pytest.approx(0.5) and cos(10) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("stage, dtype", [(1, "bfloat16"), (2, "float32"), (3, "float32")])
def test_two_ranks_resume_exactly(tiny_model, tmp_path, stage, dtype):
    """Over two data-parallel ranks each rank holds part of the masters and moments: the save gathers
    every tensor on both (a rank whose partition holds none of a tensor still takes part, with
    zeros), and a fresh pair of engines continues exactly from the files."""
    import json

    import checkpoint_ranks
    import ranks
    from hflow.engine.groups.dist import free_port

    ranks.spawn(checkpoint_ranks.run, 2, tmp_path, free_port(), stage, dtype, str(tiny_model), str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["tensors"] > 0 and result["updates"] == 3
    assert result["gap"] == {"loaded": 0.0, "after": 0.0}
    assert result["norms"][1] == pytest.approx(result["norms"][0], rel=1e-6)


def test_a_failed_write_waits_for_every_gather_then_raises(tiny_model, tmp_path, monkeypatch):
    """Rank 0 keeps taking part in the gathers after its disk filled (other ranks are in them), then
    raises the OSError, which the run directory turns into one line."""
    import errno

    from hflow.engine.training.tensor_file import TensorFileWriter

    ensure_process_group(torch.device("cpu"))
    engine = _engine(tiny_model, ActorConfig(lr=1e-2, zero_stage=2))
    _update(engine, torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0)))
    gathered = []
    get = MasterState.get
    monkeypatch.setattr(MasterState, "get", lambda self, p, key: gathered.append(key) or get(self, p, key))

    def full(self, name, tensor):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(TensorFileWriter, "write", full)
    with pytest.raises(OSError) as failed:
        engine.save(tmp_path / "ckpt")
    assert failed.value.errno == errno.ENOSPC
    assert len(gathered) == 3 * len(engine._named_params())  # every tensor still gathered


def test_the_fused_optimizer_and_the_one_rank_shortcut_update_as_torchs_adamw(tiny_model):
    """The engine's AdamW runs torch's fused kernel, and alone (ZeRO-0, one rank) it skips DeepSpeed's
    gradient all-reduce: three updates land where torch's plain AdamW on the same model lands."""
    ensure_process_group(torch.device("cpu"))
    cfg = ActorConfig(lr=1e-2, zero_stage=0, grad_clip=1e9, weight_decay=0.1)
    engine = _engine(tiny_model, cfg)
    assert engine.engine.enable_backward_allreduce is False
    assert engine.optimizer.param_groups[0]["fused"] is True
    reference = load_causal_lm(str(tiny_model), torch.float32)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=cfg.betas, weight_decay=0.1, foreach=False)
    for seed in range(3):
        ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(seed))
        _update(engine, ids)
        plain.zero_grad()
        reference(input_ids=ids, labels=ids).loss.backward()
        plain.step()
    # Adam moves an element whose gradient is near eps by up to lr on summation-order noise.
    assert_same_adam_step({n: p.detach() for n, p in engine.module.named_parameters()},
                          {n: p.detach() for n, p in reference.named_parameters()}, lr=1e-2, close=1e-5)


@pytest.mark.parametrize("grad_clip", [1e-3, 1e9])
def test_without_zero_the_engine_clips_as_deepspeed_would_and_reports_the_norm(tiny_model, monkeypatch, grad_clip):
    """ZeRO-0 in float32: the engine clips the gradients itself (`clips_itself`) and DeepSpeed does
    not. Two updates land where DeepSpeed's own clipping lands, clipped (1e-3) or not (1e9), and
    the norm the engine reports is the gradients' own, before clipping."""
    from hflow.engine.training import train_engine

    ensure_process_group(torch.device("cpu"))
    cfg = ActorConfig(lr=1e-2, zero_stage=0, grad_clip=grad_clip)
    ours = _engine(tiny_model, cfg)
    assert ours.engine.gradient_clipping() == 0.0
    monkeypatch.setattr(train_engine, "clips_itself", lambda zero_stage, bf16: False)
    deepspeeds = _engine(tiny_model, cfg)
    assert deepspeeds.engine.gradient_clipping() == grad_clip
    for seed in range(2):
        ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(seed))
        out = deepspeeds.forward(input_ids=ids, labels=ids)
        deepspeeds.backward(out.loss)
        want = float(torch.nn.utils.get_total_norm([p.grad for p in deepspeeds.module.parameters()]))
        deepspeeds.step()
        assert _update(ours, ids) == pytest.approx(want, rel=1e-5)
        assert (want > grad_clip) == (grad_clip == 1e-3)
        # Adam's step hardly depends on the gradients' scale; its moments hold the clipped gradients.
        got, expected = _states(ours), _states(deepspeeds)
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-5 if key[1] == "param" else 1e-9)


def test_a_zero_engine_starts_without_loading_torch_compiler(tiny_model):
    """DeepSpeed's ZeRO optimizer check would import its Muon optimizer, and with it torch's
    compiler (`torch._inductor.compile_fx` and what it loads: seconds of every training process's
    start); the engine imports it first with an eager default backend. In a fresh process, as every
    `hflow train` starts, and through an update (DeepSpeed's ZeRO gradient reduction imports it too)."""
    import subprocess
    import sys

    code = f"""
import sys, torch
from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training.train_engine import TrainEngine
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.placement.worker_specs import optim_spec
ensure_process_group(torch.device("cpu"))
model = load_causal_lm({str(tiny_model)!r}, torch.float32)
engine = TrainEngine(model, optim_spec(ActorConfig(zero_stage=1)), total_updates=2, micro_batch_size=2,
                     micro_steps=1, bf16=False)
ids = torch.randint(3, 50, (2, 8))
engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
engine.step()
print(type(engine.optimizer).__name__, "torch._inductor.compile_fx" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["DeepSpeedZeroOptimizer", "False"]


def test_one_cpu_rank_runs_zero_1_and_2_without_a_second_copy_of_the_weights(tiny_model, tmp_path):
    """Alone on the CPU with fp32 weights, ZeRO-1/2 have nothing to shard, and DeepSpeed's ZeRO
    optimizer would keep an fp32 master copy of the weights and a flat copy of the gradients: the
    role's engine runs them as ZeRO-0 (the same AdamW), holding a role's weights, gradients and two
    moments at its peak. The recipe's stage stays where it does something: bf16 weights (the fp32
    master is needed), several ranks, a GPU (ZeRO-2 moves the state off it during the rollout)."""
    from dataclasses import replace

    from peak_memory import PeakAllocated

    from hflow.engine.training.train_engine import stage_worth_running

    ensure_process_group(torch.device("cpu"))
    spec = replace(optim_spec(ActorConfig(lr=1e-2, zero_stage=1)), total_updates=4)
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert [stage_worth_running(replace(spec, zero_stage=s), 1, cpu, False).zero_stage for s in range(4)] == [0, 0, 0, 3]
    assert stage_worth_running(spec, 1, cpu, True).zero_stage == 1
    assert stage_worth_running(spec, 2, cpu, False).zero_stage == 1
    assert stage_worth_running(replace(spec, zero_stage=2), 1, gpu, False).zero_stage == 2

    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    peaks, weights = {}, {}
    for how in ("as the recipe says", "worth running"):
        model = load_causal_lm(str(tiny_model), torch.float32)
        weights[how] = 4 * sum(p.numel() for p in model.parameters())
        with PeakAllocated(tmp_path) as peak:
            if how == "worth running":
                engine = TrainEngine.for_role(model, spec, 1, cpu, torch.float32)
            else:
                engine = TrainEngine(model, spec, 4, spec.micro_batch_size, micro_steps=1, bf16=False)
            _update(engine, ids)
        peaks[how] = peak.peak
        assert type(engine.optimizer).__name__ == ("AdamW" if how == "worth running" else "DeepSpeedZeroOptimizer")
    # gradients + two moments (+ the activations of 48 tokens); ZeRO-1 adds a master copy, flat gradients
    # and its reduction buckets
    assert peaks["worth running"] < 3.5 * weights["worth running"]
    assert peaks["as the recipe says"] > peaks["worth running"] + 1.5 * weights["worth running"]


def test_on_the_cpu_adams_moments_exist_before_the_first_update_and_change_no_bit_of_it(tiny_model):
    """A ZeRO-0 float32 engine on the CPU creates Adam's moments when it is built (the host heap's
    layout: `TrainEngine.__init__`), as zeros with a step of 0: two updates land on the same bits as
    an engine whose moments torch creates at its first step."""
    ensure_process_group(torch.device("cpu"))
    cfg = ActorConfig(lr=1e-2, zero_stage=0, grad_clip=1e9, weight_decay=0.1)
    early = _engine(tiny_model, cfg)
    params = [p for p in early.module.parameters() if p.requires_grad]
    assert all(set(early.optimizer.state[p]) == {"step", *MOMENTS} for p in params)
    assert all(not early.optimizer.state[p]["exp_avg"].any() for p in params)
    assert early.master.step_count() == 0.0
    lazy = _engine(tiny_model, cfg)
    lazy.optimizer.state.clear()  # as torch's AdamW starts: no state until its first step
    for seed in range(2):
        ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(seed))
        _update(early, ids)
        _update(lazy, ids)
    got, want = _states(early), _states(lazy)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert early.master.step_count() == lazy.master.step_count() == 2.0
