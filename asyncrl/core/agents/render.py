"""Observations as tokens: what the chat template writes between the model's turn and its next one.

Token in, token out: the model's turns go to the learner as the engine sampled them, never decoded and
encoded again; only the environment's messages are tokenized, and only as the chat template renders them
after an assistant turn (its end-of-turn suffix, the tool or user messages, the next assistant header). The
delimiters come from rendering a fixed conversation with and without the observation and taking the
difference, so any template that renders a conversation as a prefix of its continuation works.
"""

from __future__ import annotations

from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks.base import Prompt

_PROBE = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
"""The conversation the observations are rendered after (only the tokens past it are kept)."""


class TemplateError(ValueError):
    """The chat template does not render an observation as a continuation of the conversation before it."""


class TurnRenderer:
    def __init__(self, tokenizer: ModelTokenizer, tools=None):
        self.tokenizer = tokenizer
        self.tools = list(tools or [])
        self.chat = tokenizer.has_chat_template
        if self.chat:
            base = tokenizer.render_chat(_PROBE, self.tools, add_generation_prompt=False)
            ends = [i for i, t in enumerate(base) if t in tokenizer.eos_ids]
            if not ends:
                raise TemplateError(f"the chat template of {tokenizer.source} does not end an assistant turn with an "
                                    f"end-of-turn token (eos ids {tokenizer.eos_ids}): a turn could never end")
            self._base = base
            self._after_turn = base[ends[-1] + 1:]
            """What the template writes after the assistant's end-of-turn token (e.g. a newline)."""

    def first_context(self, prompt: Prompt, opening: list[dict] = ()) -> list[int]:
        """The prompt as the model sees it, with the tools' schemas where the chat template puts them, and the
        environment's `opening` messages after it."""
        if not self.chat:
            return list(prompt.token_ids) + self.tokenizer.encode_text("".join(m["content"] for m in opening))
        messages = prompt.text if isinstance(prompt.text, list) else [{"role": "user", "content": prompt.text}]
        return self.tokenizer.render_chat([*messages, *opening], self.tools, add_generation_prompt=True)

    def observation(self, messages: list[dict]) -> list[int]:
        """Tokens from the end of a finished model turn (its end-of-turn token sampled) to the start of the next
        one: the template's suffix, `messages`, the next assistant header."""
        if not self.chat:
            return self.tokenizer.encode_text("".join(m["content"] for m in messages))
        full = self.tokenizer.render_chat([*_PROBE, *messages], self.tools, add_generation_prompt=True)
        if full[: len(self._base)] != self._base:
            raise TemplateError(f"the chat template of {self.tokenizer.source} renders a conversation differently "
                                "once messages follow it; its observations cannot be tokenized on their own")
        return self._after_turn + full[len(self._base):]
