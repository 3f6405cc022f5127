"""A checkpoint's weights read into a plain module (an evaluation, `saved_weights.py`) against the
training engine's whole load (the reference): the same weights, bit for bit, in every ZeRO stage,
in float32 and bfloat16; a file of another model refused in one line."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from hflow.engine.groups.dist import ensure_process_group
from hflow.engine.models.loading import load_causal_lm
from hflow.engine.training.saved_weights import WEIGHTS_FILE, load_saved_weights
from hflow.engine.training.train_engine import TrainEngine
from hflow.errors import UserError
from hflow.trainer.config.sections import ActorConfig
from hflow.trainer.placement.worker_specs import optim_spec


def _model(tiny_model, dtype):
    return load_causal_lm(str(tiny_model), torch.float32).to(getattr(torch, dtype))


def _engine(tiny_model, stage, dtype):
    return TrainEngine(_model(tiny_model, dtype), optim_spec(ActorConfig(lr=1e-2, zero_stage=stage)),
                       total_updates=10, micro_batch_size=4, micro_steps=1, bf16=dtype == "bfloat16")


@pytest.fixture(scope="module")
def checkpoints(tiny_model, tmp_path_factory):
    """{(stage, dtype): (checkpoint folder, the trained fp32 weights by name)} after one update."""
    ensure_process_group(torch.device("cpu"))
    ids = torch.randint(3, 50, (4, 12), generator=torch.Generator().manual_seed(0))
    out = {}
    for stage in (0, 1, 3):
        for dtype in ("float32", "bfloat16"):
            engine = _engine(tiny_model, stage, dtype)
            engine.backward(engine.forward(input_ids=ids, labels=ids).loss)
            engine.step()
            folder = tmp_path_factory.mktemp(f"ckpt-{stage}-{dtype}")
            engine.save(folder)
            out[stage, dtype] = folder, load_file(folder / WEIGHTS_FILE)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_the_weights_alone_equal_the_engines_whole_load(tiny_model, checkpoints, stage, dtype):
    folder, trained = checkpoints[stage, dtype]
    plain = _model(tiny_model, dtype)
    before = {n: p.detach().clone() for n, p in plain.named_parameters()}
    load_saved_weights(plain, folder)
    changed = 0
    for name, param in plain.named_parameters():
        # The fp32 master rounded to the module's dtype, as the engine rounds it.
        torch.testing.assert_close(param.detach(), trained[name].to(param.dtype), rtol=0, atol=0, msg=name)
        changed += not torch.equal(param.detach(), before[name])
    assert changed > 0  # the update moved weights away from the model folder's
    if stage != 3:  # ZeRO-3's own module weights are partitioned: compared above with the masters
        whole = _engine(tiny_model, stage, dtype)
        whole.load(folder)
        for (name, a), (_, b) in zip(whole.module.named_parameters(), plain.named_parameters()):
            torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=0, msg=name)


def test_only_the_trained_parameters_are_read(tiny_model, checkpoints, tmp_path):
    # A LoRA run saves its adapters alone: the frozen rest keeps the model folder's weights.
    _, trained = checkpoints[0, "float32"]
    plain = _model(tiny_model, "float32")
    frozen = "model.embed_tokens.weight"
    plain.get_parameter(frozen).requires_grad_(False)
    base = plain.get_parameter(frozen).detach().clone()
    save_file({k: v for k, v in trained.items() if k != frozen}, tmp_path / WEIGHTS_FILE)
    load_saved_weights(plain, tmp_path)
    assert torch.equal(plain.get_parameter(frozen).detach(), base)
    assert not torch.equal(base, trained[frozen])  # the file's own copy would have been another
    assert torch.equal(plain.get_parameter("lm_head.weight").detach(), trained["lm_head.weight"])


@pytest.mark.parametrize("change, said", [
    ("drop", "lacks 1 of the recipe's trained parameters (lm_head.weight, ...)"),
    ("add", "holds 1 the recipe's model does not train (base_model.extra, ...)"),
    ("reshape", "lm_head.weight has shape (7, 5), the recipe's model"),
])
def test_a_checkpoint_of_another_model_is_refused_in_one_line(tiny_model, checkpoints, tmp_path, change, said):
    _, trained = checkpoints[0, "float32"]
    tensors = dict(trained)
    if change == "drop":
        del tensors["lm_head.weight"]
    elif change == "add":
        tensors["base_model.extra"] = torch.zeros(3)
    else:
        tensors["lm_head.weight"] = torch.zeros(7, 5)
    save_file(tensors, tmp_path / WEIGHTS_FILE)
    plain = _model(tiny_model, "float32")
    before = {n: p.detach().clone() for n, p in plain.named_parameters()}
    with pytest.raises(UserError) as err:
        load_saved_weights(plain, tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / WEIGHTS_FILE) in message and said in message
    # Refused before any tensor is written (the reshaped one is the last): the module is untouched.
    assert all(torch.equal(p.detach(), before[n]) for n, p in plain.named_parameters())
