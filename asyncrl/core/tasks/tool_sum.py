"""The `tool_sum` task, the agent demo: the arith task's sums of `num_terms` numbers as a chat prompt, which the
model solves over several turns with an `add` tool (`environment.type: tools`, examples/agent/tools.py), one
call per term after the first, then the answer. Its character tokenizer has a chat template with role markers
and the `<tool_call>` tags as tokens (`ModelTokenizer.chat_chars`)."""

from __future__ import annotations

import json

from asyncrl.core.model.tokenizer import CHAT_ALPHABET, CHAT_SPECIALS, CHAT_TEMPLATE, ModelTokenizer
from asyncrl.core.tasks.arith import ArithTask
from asyncrl.core.tasks.base import Prompt
from asyncrl.core.tasks.registry import register_task


class ToolSumTask(ArithTask):
    name = "tool_sum"
    reward_name = "arith_exact"
    CHAR_TOKENIZER = (CHAT_ALPHABET, CHAT_SPECIALS, CHAT_TEMPLATE)

    def __init__(self, task_cfg, tokenizer: ModelTokenizer | None = None):
        super().__init__(task_cfg, tokenizer or ModelTokenizer.chat_chars())

    def _prompt(self, *terms: int) -> Prompt:
        messages = [{"role": "user", "content": "+".join(map(str, terms)) + "="}]
        return Prompt(text=messages, token_ids=self.tokenizer.encode_prompt(messages),
                      metadata={"answer": str(sum(terms)), "terms": json.dumps(terms)})

    def target_turns(self, prompt: Prompt) -> list[str]:
        """Add the running total and the next term with the tool, term after term, then answer."""
        terms = json.loads(prompt.metadata["terms"])
        turns, total = [], terms[0]
        for term in terms[1:]:
            call = {"name": "add", "arguments": {"a": total, "b": term}}
            turns.append(f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>")
            total += term
        return [*turns, str(total)]

    @property
    def max_response_tokens(self) -> int:
        return 64


register_task("tool_sum", ToolSumTask)
