"""The `dataset` task on small files made here: formats, chat templates, the held-out split, epochs, limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.core.config.data import DatasetConfig, RewardConfig, TaskConfig
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.core.tasks import get_task

TOKENIZER = Path(__file__).resolve().parents[2] / "examples" / "word_problems" / "tokenizer"


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return ModelTokenizer.load(TOKENIZER)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat_rows(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} plus 1?"}], "answer": str(i + 1), "id": i}
            for i in range(n)]  # fmt: skip


def task_of(tokenizer, **dataset):
    return get_task(TaskConfig(name="dataset", dataset=DatasetConfig(**dataset)), tokenizer,
                    RewardConfig(type="exact_match"))  # fmt: skip


def test_chat_messages_use_the_models_template_and_other_fields_are_metadata(tmp_path, tokenizer):
    task = task_of(tokenizer, train_files=[write_jsonl(tmp_path / "t.jsonl", chat_rows(30))], eval_size=5,
                   prompt_field="messages")  # fmt: skip
    prompt = task.train_prompt(0)
    rendered = tokenizer.hf.decode(prompt.token_ids)
    assert rendered.startswith("<|im_start|>user\nWhat is ") and rendered.endswith("<|im_start|>assistant\n")
    assert set(prompt.metadata) == {"answer", "id"} and prompt.metadata["answer"] == str(prompt.metadata["id"] + 1)


def test_held_out_split_is_disjoint_and_every_epoch_visits_every_row_once(tmp_path, tokenizer):
    task = task_of(tokenizer, train_files=[write_jsonl(tmp_path / "t.jsonl", chat_rows(30))], eval_size=5,
                   prompt_field="messages", seed=3)  # fmt: skip
    held_out = {p.metadata["id"] for p in task.eval_prompts()}
    assert len(held_out) == 5 and task.num_train == 25
    epochs = [[task.train_prompt(e * 25 + k).metadata["id"] for k in range(25)] for e in range(3)]
    for ids in epochs:
        assert sorted(ids) == sorted(set(range(30)) - held_out)
    assert epochs[0] != epochs[1] != epochs[2]  # a new order every epoch
    again = task_of(tokenizer, train_files=[str(tmp_path / "t.jsonl")], eval_size=5, prompt_field="messages", seed=3)
    assert [again.train_prompt(k).metadata["id"] for k in (0, 7, 31, 60)] == [
        task.train_prompt(k).metadata["id"] for k in (0, 7, 31, 60)
    ]  # every process agrees on what an index means


def test_parquet_plain_prompts_eval_file_and_chat_wrapping(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": f"Add 2 and {i}.", "answer": str(i + 2)} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:4]), tmp_path / "eval.parquet")
    plain = task_of(tokenizer, train_files=[str(tmp_path / "train.parquet")], eval_files=[str(tmp_path / "eval.parquet")],
                    prompt_field="question")  # fmt: skip
    assert plain.num_train == 12 and len(plain.eval_prompts()) == 4
    assert tokenizer.hf.decode(plain.eval_prompts()[0].token_ids) == "Add 2 and 0."
    wrapped = task_of(tokenizer, train_files=[str(tmp_path / "train.parquet")], eval_size=2, prompt_field="question",
                      chat_template_for_text=True)  # fmt: skip
    assert tokenizer.hf.decode(wrapped.train_prompt(0).token_ids).startswith("<|im_start|>user\nAdd 2 and ")


def test_over_long_prompts_are_skipped_and_counted(tmp_path, tokenizer):
    rows = chat_rows(10) + [{"messages": [{"role": "user", "content": "word " * 200}], "answer": "0", "id": 99}]
    task = task_of(tokenizer, train_files=[write_jsonl(tmp_path / "t.jsonl", rows)], eval_size=2,
                   prompt_field="messages", max_prompt_tokens=40)  # fmt: skip
    assert task.skipped == {"task.dataset.train_files": 1} and task.num_train == 8


def test_bad_datasets_fail_with_the_key_named(tmp_path, tokenizer):
    good = write_jsonl(tmp_path / "t.jsonl", chat_rows(10))
    with pytest.raises(ValueError, match="rows have no field 'prompt'"):
        task_of(tokenizer, train_files=[good], eval_size=2)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="task.dataset.train_files"):
        task_of(tokenizer, train_files=[str(tmp_path / "empty.jsonl")], prompt_field="messages")
    with pytest.raises(ValueError, match="task.dataset.train_files: .*does not exist"):
        task_of(tokenizer, train_files=[str(tmp_path / "missing.jsonl")], prompt_field="messages")
    with pytest.raises(ValueError, match="eval_size \\(20\\) leaves no training rows"):
        task_of(tokenizer, train_files=[good], eval_size=20, prompt_field="messages")
    with pytest.raises(ValueError, match="neither .jsonl/.json nor .parquet"):
        DatasetConfig(train_files=["data.csv"])
    with pytest.raises(ValueError, match="train_files: must name at least one file"):
        TaskConfig(name="dataset")
