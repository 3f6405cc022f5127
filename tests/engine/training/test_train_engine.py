"""Checkpoints of the DeepSpeed engine: save -> load -> next update equals the uninterrupted one."""

import pytest
import torch
from safetensors.torch import load_file

from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training.train_engine import TrainEngine, lr_lambda
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.control.worker_specs import optim_spec


def _update(engine, ids):
    out = engine.forward(input_ids=ids, labels=ids)
    engine.backward(out.loss)
    return engine.step()


def _engine(tiny_model, cfg, weights=None):
    model = load_causal_lm(str(tiny_model), torch.float32)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    return TrainEngine(model, optim_spec(cfg), total_updates=10, micro_batch_size=4, micro_steps=1, bf16=False)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_resume_continues_exactly(tiny_model, tmp_path, stage):
    ensure_process_group(torch.device("cpu"))
    cfg = ActorConfig(lr=1e-2, zero_stage=stage, warmup_steps=2, lr_schedule="cosine")
    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    first = _engine(tiny_model, cfg)
    _update(first, ids)
    _update(first, ids)
    first.save(tmp_path / "ckpt")
    norm_a = _update(first, ids)

    second = _engine(tiny_model, cfg, load_file(tmp_path / "ckpt" / "weights.safetensors"))
    second.load(tmp_path / "ckpt")
    assert second.updates == 2 and second.lr == pytest.approx(first_lr_at(cfg, 2))
    norm_b = _update(second, ids)
    assert norm_b == pytest.approx(norm_a, rel=1e-6)
    for (name, a), (_, b) in zip(first._named_params(), second._named_params()):
        torch.testing.assert_close(first._full_state(a, "param"), second._full_state(b, "param"),
                                   rtol=0, atol=0, msg=name)


def first_lr_at(cfg, step):
    return cfg.lr * lr_lambda(optim_spec(cfg), 10)(step)


def test_lr_schedule_shapes():
    cfg = ActorConfig(lr=1.0, warmup_steps=2, lr_schedule="linear", min_lr_ratio=0.1)
    f = lr_lambda(optim_spec(cfg), 12)
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == pytest.approx(1.0) and f(7) == pytest.approx(0.1 + 0.9 * 0.5) and f(12) == pytest.approx(0.1)
    cos = lr_lambda(optim_spec(ActorConfig(lr=1.0, lr_schedule="cosine")), 10)
    assert cos(5) == pytest.approx(0.5) and cos(10) == pytest.approx(0.0, abs=1e-12)
