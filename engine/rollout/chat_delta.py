"""Token ids of an episode's messages through the chat template, without re-tokenizing the episode.

The sampled tokens of a turn stay exactly as sampled; after them come only the tokens of the
NEW messages, which are the chat template's delta: the template applied to a fixed stand-in
conversation plus the new messages (with the generation prompt of the next assistant turn),
minus the template applied to the stand-in alone. Before that delta goes whatever the template
writes after an assistant message's content that the sampled turn does not already end with
(e.g. the "\\n" after Qwen's "<|im_end|>", or the whole end-of-turn marker when the turn was cut
by the token limit). Tokenizing a text piece alone can differ from tokenizing it in context only
at its first token; the delta starts at a role marker (usually a special token), as in verl's and
SkyRL's multi-turn rollouts.
"""

from __future__ import annotations

from hflow.errors import UserError

_STAND_IN = [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]


class ChatDelta:
    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("rollout.env needs a tokenizer with a chat template (the model's tokenizer has none): "
                            "episodes are chat conversations")
        base = self._render(_STAND_IN, generation_prompt=False)
        cut = base.rfind("A")
        self.base = base
        self.after_assistant = base[cut + 1:]  # what the template writes after an assistant's content

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        kwargs = {"tools": self.tools} if self.tools else {}
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                                  tokenize=False, **kwargs)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first messages of an episode, with the tools advertised and the generation prompt."""
        return self._encode(self._render(messages, generation_prompt=True))

    def observation_ids(self, messages: list[dict], turn_ids: list[int]) -> list[int]:
        """The tokens to append after a sampled turn `turn_ids`: the rest of the assistant's
        end-of-turn, the observation `messages`, and the next assistant turn's generation prompt."""
        full = self._render(_STAND_IN + messages, generation_prompt=True)
        if not full.startswith(self.base):
            raise UserError("rollout.env: the model's chat template renders a conversation's earlier messages "
                            "differently once more follow, so an observation cannot be appended as a delta")
        tail = self.tokenizer.decode(turn_ids[-8:], skip_special_tokens=False) if turn_ids else ""
        closing = self.after_assistant
        # The longest start of the end-of-turn text that the sampled turn already ends with.
        done = next((k for k in range(len(closing), 0, -1) if tail.endswith(closing[:k])), 0)
        return self._encode(closing[done:] + full[len(self.base):])
