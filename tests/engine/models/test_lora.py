"""LoRA on the actor: only the adapters train, the reference is the base with adapters off,
and the merged weights (vLLM's, final/'s) compute what the adapted model computes."""

import pytest
import torch

from hflow.engine import columns as col
from hflow.engine.groups.batch import Batch
from hflow.engine.models.loading import load_causal_lm, load_tokenizer
from hflow.engine.models.lora import apply_lora, merged_state
from hflow.engine.training.logprobs import batched_log_probs
from hflow.engine.specs import LoraSpec
from hflow.errors import UserError
from hflow.trainer.config.load import build_recipe
from hflow.trainer.placement.worker_groups import build_worker_groups
from hflow.trainer.data.prompts import PromptData


def _recipe(model, **lora):
    return build_recipe({
        "model": {"path": str(model)}, "data": {"train": "synthetic:digits", "synthetic_size": 32},
        "rollout": {"n": 4, "max_response_length": 12},
        "actor": {"lr": 0.01, "micro_batch_size": 16, "mini_batch_size": 16, "lora": {"rank": 4, **lora}},
        "trainer": {"prompts_per_step": 4},
    }, {}, "test")


@pytest.fixture(scope="module")
def trained(tiny_model):
    """A LoRA actor after three updates, its weights before them, and the rollout it trained on."""
    recipe = _recipe(tiny_model)
    actor = build_worker_groups(recipe, ["actor"], torch.device("cpu"))["actor"]
    actor.init_model()
    module = actor.worker.train_engine.module
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    batch = actor.generate_sequences(PromptData(recipe.data, load_tokenizer(str(tiny_model)), 0, 4).batch(1))
    batch |= actor.compute_log_prob(batch)
    for seed in range(3):
        batch |= Batch({col.ADVANTAGES: torch.randn(len(batch), generator=torch.Generator().manual_seed(seed))})
        actor.update_actor(batch)
    return actor, before, batch


def test_only_the_adapters_train_and_the_base_weights_stay_bitwise(trained):
    actor, before, _ = trained
    engine = actor.worker.train_engine
    after = engine.module.state_dict()
    adapters = [k for k in before if ".lora_" in k]
    assert adapters and len(adapters) < len(before)
    for name in before:
        if ".lora_" in name:
            assert not torch.equal(after[name], before[name]), f"adapter {name} did not train"
        else:
            assert torch.equal(after[name], before[name]), f"base weight {name} changed"
    # The optimizer (DeepSpeed's too) holds the adapters alone.
    optimized = sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    assert optimized == sum(before[k].numel() for k in adapters)


def test_reference_is_the_base_model_with_the_adapters_off(trained, tiny_model):
    actor, _, batch = trained
    ref = actor.compute_ref_log_prob(batch)[col.REF_LOG_PROBS]
    base = load_causal_lm(str(tiny_model), torch.float32).eval()
    want, _ = batched_log_probs(base, batch, 1.0, 16)
    mask = batch[col.RESPONSE_MASK].bool()
    assert float((ref - want)[mask].abs().max()) <= 1e-6
    # ... while the policy itself moved away from it: the adapters are back on afterwards.
    policy = actor.compute_log_prob(batch)[col.OLD_LOG_PROBS]
    assert float((policy - want)[mask].abs().max()) > 1e-2


def test_merged_weights_compute_what_the_adapted_model_computes(trained, tiny_model, tmp_path):
    actor, _, batch = trained
    module = actor.worker.train_engine.module
    adapters = {k: v.clone() for k, v in module.state_dict().items() if ".lora_" in k}
    merged = dict(merged_state(module))
    plain = load_causal_lm(str(tiny_model), torch.float32)
    assert list(merged) == [n for n, _ in plain.named_parameters()]  # vLLM's names: the base model's
    plain.load_state_dict(merged)
    got, _ = batched_log_probs(plain.eval(), batch, 1.0, 16)
    want = actor.compute_log_prob(batch)[col.OLD_LOG_PROBS]
    mask = batch[col.RESPONSE_MASK].bool()
    assert float((got - want)[mask].abs().max()) <= 1e-5
    for name, value in module.state_dict().items():  # merging left the trained module as it was
        if name in adapters:
            assert torch.equal(value, adapters[name])


def test_final_holds_a_plain_merged_model_and_the_adapters(trained, tiny_model, tmp_path):
    from peft import PeftModel

    actor, _, batch = trained
    actor.export_weights(str(tmp_path / "final"))
    want = actor.compute_log_prob(batch)[col.OLD_LOG_PROBS]
    mask = batch[col.RESPONSE_MASK].bool()
    merged = load_causal_lm(str(tmp_path / "final"), torch.float32).eval()
    assert type(merged).__name__ == "LlamaForCausalLM"
    got, _ = batched_log_probs(merged, batch, 1.0, 16)
    assert float((got - want)[mask].abs().max()) <= 1e-5
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").is_file()
    base = load_causal_lm(str(tiny_model), torch.float32)
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "final" / "adapter")).eval()
    got, _ = batched_log_probs(adapted, batch, 1.0, 16)
    assert float((got - want)[mask].abs().max()) <= 1e-5


def test_a_target_module_the_model_lacks_is_named_with_those_it_has(tiny_model):
    model = load_causal_lm(str(tiny_model), torch.float32)
    with pytest.raises(UserError) as err:
        apply_lora(model, LoraSpec(4, 8.0, 0.0, ("q_proj", "qkv_proj")), "actor", "m")
    message = str(err.value)
    assert "actor.lora.target_modules" in message and "'qkv_proj'" in message
    assert "q_proj" in message.split("its linear layers:")[1] and "\n" not in message


def test_listed_targets_get_adapters_and_the_rest_do_not(tiny_model):
    model = apply_lora(load_causal_lm(str(tiny_model), torch.float32), LoraSpec(2, 4.0, 0.0, ("v_proj",)), "a", "m")
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all(".v_proj.lora_" in n for n in trained)
