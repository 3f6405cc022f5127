"""Score models: a transformer backbone with a scalar head, scoring every position.

One class serves three roles. A reward or cost model reads the score at the last token of
prompt + response; a critic (value model) reads it at every position before a response
token. Weights come from either
  - a sequence-classification directory (AutoModelForSequenceClassification, one label):
    its backbone and its `score` head, as safe-rlhf and OpenRLHF initialise critics from
    the reward model; or
  - a causal LM directory (e.g. the actor's): its backbone (AutoModel) and a new head,
    initialised from the seed (normal, std 1 / (hidden + 1), as OpenRLHF's value head).

Shapes: input_ids, attention_mask, position_ids (B, L) -> scores (B, L), float32.

The head computes in float32 whatever the backbone's dtype (`Fp32Head`): a value or a reward is
one number read off a regression head, and bfloat16 keeps 8 significant bits, so a value of 3.14
comes out as 3.140625, and GAE's TD errors r + gamma V(s') - V(s), differences of close values,
would be mostly rounding (a bf16 step at 3.14 is 0.0156).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from hflow.engine.kernels.product_route import route_linears
from hflow.engine.models.folder import check_model_source
from hflow.engine.models.fused_layers import fuse_layers
from hflow.errors import UserError


class Fp32Head(nn.Linear):
    """The scalar head, kept and computed in float32: (B, L, H) hidden states of any dtype ->
    (B, L, 1) float32.

    Its weights are float32 as loaded (a reward or cost model keeps them so). A critic trains
    under DeepSpeed, whose bf16 mode casts every parameter to bf16 for the forward pass
    (runtime/engine.py, `_cast_module_mixed_precision`: no per-parameter exception) and keeps the
    fp32 master copy in its optimizer, which the update and the checkpoints use; the head still
    multiplies in fp32, from that copy's bf16 rounding. It is a module of its own, called as
    one, so that ZeRO-3 gathers its weight before the forward (its hooks are per module)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.linear(hidden.float(), self.weight.float(), bias)

    @classmethod
    def of(cls, linear: nn.Linear) -> "Fp32Head":
        """`linear`'s parameters (the same Parameter objects), in float32, under this forward."""
        head = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        head.weight = linear.weight
        head.bias = linear.bias
        return head.float()


class ScoreModel(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.head = head if isinstance(head, Fp32Head) else Fp32Head.of(head)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.head(hidden).squeeze(-1)

    def gradient_checkpointing_enable(self) -> None:
        self.backbone.gradient_checkpointing_enable()


def is_score_checkpoint(path: str) -> bool:
    """Whether `path` holds a sequence-classification model (by its config's architectures)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        from transformers import AutoConfig

        architectures = AutoConfig.from_pretrained(path).architectures or []
    else:
        architectures = json.loads(config.read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


def load_score_model(path: str, dtype: torch.dtype, trust_remote_code: bool = False,
                     seed: int = 0, what: str = "score model") -> ScoreModel:
    """A ScoreModel from a sequence-classification or a causal-LM directory (see the module doc)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    check_model_source(path, what, tokenizer=False)
    try:
        if is_score_checkpoint(path):
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=dtype, trust_remote_code=trust_remote_code, output_loading_info=True)
            route_linears(model)
            fuse_layers(model)
            return _from_classifier(model, info, path, what)
        backbone = AutoModel.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        route_linears(backbone)
        fuse_layers(backbone)  # its norms and MLPs, as a policy's (`fused_layers.py`)
    except OSError as err:
        raise UserError(f"{what} '{path}': cannot load ({str(err).splitlines()[0]})") from None
    hidden = backbone.config.hidden_size
    head = nn.Linear(hidden, 1, bias=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        nn.init.normal_(head.weight, std=1.0 / (hidden + 1))
    return ScoreModel(backbone, head)


def _from_classifier(model, info: dict, path: str, what: str) -> ScoreModel:
    head = getattr(model, "score", None)
    name = type(model).__name__
    if not isinstance(head, nn.Linear):
        raise UserError(f"{what} '{path}' ({name}) has no `score` head; hflow scores decoder models "
                        "whose sequence classifier is a linear `score` head (Llama, Qwen2, Mistral, Gemma, ...)")
    if head.out_features != 1:
        raise UserError(f"{what} '{path}': has {head.out_features} labels; a reward, cost or value model "
                        "has exactly one (num_labels=1)")
    missing = [k for k in info.get("missing_keys", []) if k.startswith("score.")]
    if missing:
        # A checkpoint whose head is stored under another name would otherwise score with a random head.
        raise UserError(f"{what} '{path}': the checkpoint has no weights for {', '.join(missing)}; convert "
                        "its scalar head to `score.weight` (AutoModelForSequenceClassification layout)")
    return ScoreModel(getattr(model, model.base_model_prefix), head)


def last_token_scores(scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) the score at each row's last attended position: (B, L), (B, L) -> (B,)."""
    positions = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    last = (attention_mask * positions).argmax(-1)
    return scores.gather(1, last[:, None]).squeeze(1)
