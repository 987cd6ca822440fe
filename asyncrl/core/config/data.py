"""Config sections for what the policy trains on: the task (the built-in synthetic one, or prompts from local
dataset files) and the reward. Part of the one schema in `asyncrl.core.config.schema`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from asyncrl.core.config.base import Section
from asyncrl.core.tasks.reasoning_gym_options import spec_problem
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


class ReasoningGymDataset(Section):
    """One reasoning-gym dataset of the task's mixture."""

    name: str
    """A reasoning-gym dataset (`basic_arithmetic`, `chain_sum`, `gsm_symbolic`, ...; over a hundred)."""
    weight: float = Field(1.0, gt=0)
    """Share of the mixture, relative to the other datasets' weights."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The dataset's own options (its config dataclass's fields, e.g. `max_digits`); `seed` and `size` are the
    task's."""


class ReasoningGymConfig(Section):
    """Prompts and rewards from the `reasoning-gym` package (`task.name: reasoning_gym`)."""

    datasets: list[ReasoningGymDataset] = Field(default_factory=list)
    """The dataset, or the weighted mixture, prompts are drawn from. Names and options are checked at load."""
    size: int = Field(10000, ge=1)
    """Training entries generated (the pool the epochs go through)."""
    eval_size: int = Field(200, ge=1)
    """Held-out entries (generated after the training pool; a training entry with a held-out question is
    dropped)."""
    seed: int = 0
    """Seed of the mixture, of every dataset in it and of the epochs' order."""
    system_prompt: str | None = None
    """System message before each question; empty: the chat template's own default."""
    instruction: str = ""
    """Text appended to each question after a blank line (e.g. how to format the answer)."""
    answer_tag: str | None = "answer"
    """The answer is the text inside the response's last <answer_tag>...</answer_tag>; empty: no tag."""
    fallback: Literal["none", "last_number", "last_line", "whole"] = "none"
    """The answer when the response has no tag: none (scores 0), the last number, the last non-empty line, or
    the whole response."""

    @model_validator(mode="after")
    def _check(self) -> ReasoningGymConfig:
        for i, dataset in enumerate(self.datasets):
            problem = spec_problem(dataset.name, dataset.config)
            if problem:
                key, message = problem
                raise ValueError(f"task.reasoning_gym.datasets[{i}].{key}: {message}")
        return self


class TaskConfig(Section):
    name: Literal["arith", "tool_sum", "dataset", "reasoning_gym"] = "arith"
    """`arith`: the built-in synthetic addition task (the demo); `tool_sum`: the same sums as chat prompts,
    solved with an `add` tool over several turns (the agent demo, with `environment.type: tools`); `dataset`:
    prompts from `task.dataset`; `reasoning_gym`: procedural reasoning tasks and their verifiers
    (`task.reasoning_gym`)."""
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
    reasoning_gym: ReasoningGymConfig = ReasoningGymConfig()
    """reasoning-gym datasets (used when name is `reasoning_gym`)."""

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.name == "dataset" and not self.dataset.train_files:
            raise ValueError("task.dataset.train_files: must name at least one file when task.name is 'dataset'")
        if self.name == "reasoning_gym" and not self.reasoning_gym.datasets:
            raise ValueError("task.reasoning_gym.datasets: must name at least one dataset when task.name is "
                             "'reasoning_gym'")
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
    """Threads per rollout replica (and in the learner, for its held-out evaluation) that compute rewards, so a
    slow verifier does not hold up generation."""
    timeout_s: float = Field(30.0, gt=0)
    """A sample whose reward takes longer gets reward 0 (counted as an error), on a replica and in the learner's
    held-out evaluation. A call that never returns keeps its worker; once every worker is kept so for one more
    time-out, the replica exits to be restarted, or the learner's evaluation fails (`RewardWorkersHung` in its
    log)."""
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
