"""The `dataset` task: prompts from local JSONL or Parquet files, read with the `datasets` library.

Every process builds the same task from the same files and config, so a prompt index means the same row
everywhere without any process talking to another:
- prompts longer than `max_prompt_tokens` (after the chat template) are dropped at load and counted;
- without `eval_files`, a seeded permutation of the remaining rows puts the last `eval_size` aside as the
  held-out set (never trained on);
- training prompt k is row `perm_e[k mod n]` of epoch `e = k div n` (`EpochOrder`): every epoch visits every
  row once, in a new order.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks.base import Prompt, Task
from asyncrl.core.tasks.epochs import EpochOrder
from asyncrl.core.tasks.registry import register_task

log = logging.getLogger(__name__)

# Sub-stream of the seeded generator for the held-out split (the epochs' orders draw from another).
_SPLIT_STREAM = 0


def load_rows(files: list[str], key: str) -> list[dict]:
    """All rows of `files` as dicts, via `datasets` (one format per call: JSON lines or Parquet)."""
    import datasets

    for path in files:
        if not Path(path).is_file():
            raise ValueError(f"{key}: {path!r} does not exist")
    kinds = {"parquet" if path.endswith(".parquet") else "json" for path in files}
    if len(kinds) > 1:
        raise ValueError(f"{key}: mixes JSON lines and Parquet files; use one format per list")
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(kinds.pop(), data_files=list(files), split="train")
    except Exception as err:  # noqa: BLE001 - a file the library cannot read, reported by name
        raise ValueError(f"{key}: cannot read {files}: {type(err).__name__}: {err}") from None
    return table.to_list()


class DatasetTask(Task):
    name = "dataset"
    reward_name = ""  # no reward of its own: the `reward` section names one

    def __init__(self, task_cfg, tokenizer: ModelTokenizer | None = None):
        if tokenizer is None:
            raise ValueError("the dataset task needs the model's tokenizer (ModelTokenizer.load(model.path))")
        cfg = task_cfg.dataset
        self.cfg, self.tokenizer = cfg, tokenizer
        self.skipped: dict[str, int] = {}
        train = self._prompts(load_rows(cfg.train_files, "task.dataset.train_files"), "task.dataset.train_files")
        if cfg.eval_files:
            held_out = self._prompts(load_rows(cfg.eval_files, "task.dataset.eval_files"), "task.dataset.eval_files")
            held_out = held_out[: cfg.eval_size]
        else:
            if len(train) <= cfg.eval_size:
                raise ValueError(
                    f"task.dataset.eval_size ({cfg.eval_size}) leaves no training rows: the training files have "
                    f"{len(train)} usable prompts (name eval_files or lower eval_size)"
                )
            order = np.random.default_rng([cfg.seed, _SPLIT_STREAM]).permutation(len(train))
            held_out = [train[i] for i in order[len(train) - cfg.eval_size :]]
            train = [train[i] for i in sorted(order[: len(train) - cfg.eval_size])]
        self._train, self._eval = train, held_out
        self._order = EpochOrder(cfg.seed, len(train))
        if any(self.skipped.values()):
            log.warning("prompts longer than %d tokens skipped: %s", cfg.max_prompt_tokens, self.skipped)

    def _prompts(self, rows: list[dict], key: str) -> list[Prompt]:
        if not rows:
            raise ValueError(f"{key}: the files hold no rows")
        field = self.cfg.prompt_field
        if field not in rows[0]:
            raise ValueError(f"{key}: rows have no field {field!r} (task.dataset.prompt_field); fields: {sorted(rows[0])}")
        prompts, skipped = [], 0
        for i, row in enumerate(rows):
            prompt = row.get(field)
            if isinstance(prompt, str) and self.cfg.chat_template_for_text:
                prompt = [{"role": "user", "content": prompt}]
            if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt))):
                raise ValueError(f"{key}: row {i}: {field!r} must be a string or a list of chat messages")
            ids = self.tokenizer.encode_prompt(prompt)
            if len(ids) > self.cfg.max_prompt_tokens:
                skipped += 1
                continue
            metadata = {k: v for k, v in row.items() if k != field}
            prompts.append(Prompt(text=prompt, token_ids=ids, metadata=metadata))
        self.skipped[key] = skipped
        if not prompts:
            raise ValueError(f"{key}: every prompt is longer than task.dataset.max_prompt_tokens ({self.cfg.max_prompt_tokens})")
        return prompts

    def target_text(self, prompt: Prompt) -> str:
        field = self.cfg.target_field
        if field not in prompt.metadata:
            raise ValueError(f"task.dataset.target_field: prompt rows have no field {field!r}")
        return str(prompt.metadata[field])

    @property
    def num_train(self) -> int:
        return len(self._train)

    def position(self, index: int) -> tuple[int, int]:
        """(epoch, row) of training prompt `index`."""
        return self._order.position(index)

    def train_prompt(self, index: int) -> Prompt:
        return self._train[self.position(index)[1]]

    def eval_prompts(self) -> list[Prompt]:
        return list(self._eval)


register_task("dataset", DatasetTask)
