"""Config sections for what the policy trains on: the task (the built-in synthetic one, or prompts from local
dataset files) and the reward. Part of the one schema in `asyncrl.core.config.schema`."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from asyncrl.core.config.base import Section
from asyncrl.core.tasks.rewards import resolve_function


class DatasetConfig(Section):
    """Prompts from local files, read with the `datasets` library (`task.name: dataset`)."""

    train_files: list[str] = Field(default_factory=list)
    """Training files (JSONL or Parquet; the format follows the extension, `.jsonl`/`.json` or `.parquet`)."""
    eval_files: list[str] = Field(default_factory=list)
    """Held-out files for evaluation. Empty: the last `eval_size` rows of the shuffled training data are
    held out instead (and never trained on)."""
    eval_size: int = Field(100, ge=1)
    """Held-out rows taken from the training data when `eval_files` is empty; at most this many are evaluated
    from `eval_files` otherwise."""
    prompt_field: str = "prompt"
    """Field holding the prompt: a plain string, or a list of chat messages ({role, content}) rendered with the
    model's chat template. Every other field is handed to the reward as metadata."""
    target_field: str = "answer"
    """Field holding a reference response, used only by supervised warm starts (`asyncrl make-tiny-model`)."""
    chat_template_for_text: bool = False
    """Wrap plain-string prompts as one user message and render them with the chat template too."""
    max_prompt_tokens: int = Field(512, ge=1)
    """Prompts longer than this (in tokens, after the template) are skipped and counted, not trained on."""
    seed: int = 0
    """Seed of the per-epoch shuffle: prompt index k is row perm_e[k mod n] of epoch e = k div n."""

    @model_validator(mode="after")
    def _check(self) -> DatasetConfig:
        for key, files in (("train_files", self.train_files), ("eval_files", self.eval_files)):
            for path in files:
                if not path.endswith((".jsonl", ".json", ".parquet")):
                    raise ValueError(f"task.dataset.{key}: {path!r} is neither .jsonl/.json nor .parquet")
        return self


class TaskConfig(Section):
    name: Literal["arith", "tool_sum", "dataset"] = "arith"
    """`arith`: the built-in synthetic addition task (the demo); `tool_sum`: the same sums as chat prompts,
    solved with an `add` tool over several turns (the agent demo, with `environment.type: tools`); `dataset`:
    prompts from `task.dataset`."""
    num_digits: int = Field(2, ge=1, le=6)
    """arith, tool_sum: operands have up to this many digits."""
    num_terms: int = Field(2, ge=2, le=9)
    """arith, tool_sum: operands per prompt."""
    eval_size: int = Field(200, ge=1)
    """arith, tool_sum: held-out prompts for evaluation (disjoint from the training stream)."""
    seed: int = 0
    """arith, tool_sum: seed of the prompt stream."""
    dataset: DatasetConfig = DatasetConfig()
    """Prompt files (used when name is `dataset`)."""

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.name == "dataset" and not self.dataset.train_files:
            raise ValueError("task.dataset.train_files: must name at least one file when task.name is 'dataset'")
        return self


class WeightedReward(Section):
    weight: float = 1.0
    """Factor of this component in the sum."""
    reward: RewardConfig
    """The component."""


class RewardConfig(Section):
    type: Literal["task", "exact_match", "math_verify", "regex", "function", "weighted"] = "task"
    """`task`: the task's own reward (arith: exact answer); `exact_match`: the normalised response equals the
    `answer_field` (case, whitespace and surrounding punctuation aside); `math_verify`: mathematical
    equivalence with `math-verify`; `regex`: 1 when `pattern` matches; `function`: a user function;
    `weighted`: the weighted sum of `components`."""
    answer_field: str = "answer"
    """Metadata field holding the reference answer (exact_match, math_verify)."""
    pattern: str | None = None
    """Regular expression (regex), searched in the response."""
    function: str | None = None
    """User reward `fn(response_text, metadata) -> float` as `package.module:function` or
    `path/to/file.py:function` (relative to the working directory). Imported and checked at load."""
    components: list[WeightedReward] = Field(default_factory=list)
    """Parts of a weighted reward."""
    workers: int = Field(4, ge=1)
    """Threads per rollout replica that compute rewards, so a slow verifier does not hold up generation."""
    timeout_s: float = Field(30.0, gt=0)
    """A sample whose reward takes longer gets reward 0 (counted as an error). A call that never returns
    keeps its worker; once every worker is kept so for one more time-out, the replica exits to be restarted
    (`RewardWorkersHung` in its log)."""
    max_abs: float = Field(1.0e6, gt=0)
    """A group with a reward that is not finite or has |reward| above this is dead-lettered, never trained on
    (on write by the replica, on read by the learner): one absurd value would dominate the advantages."""

    @model_validator(mode="after")
    def _check(self) -> RewardConfig:
        if self.type == "regex":
            if not self.pattern:
                raise ValueError("reward.pattern: required when reward.type is 'regex'")
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise ValueError(f"reward.pattern: not a regular expression: {err}") from None
        if self.type == "function":
            if not self.function:
                raise ValueError("reward.function: required when reward.type is 'function'")
            try:
                resolve_function(self.function)
            except ValueError as err:
                raise ValueError(f"reward.function: {err}") from None
        if self.type == "weighted" and not self.components:
            raise ValueError("reward.components: a weighted reward needs at least one component")
        return self


WeightedReward.model_rebuild()
