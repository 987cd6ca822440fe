"""The character tokenizer and `make-tiny-model`: HF-loadable files, head-size check, stamp caching."""

import json

import pytest
import torch

from asyncrl.core.config.schema import AsyncRLConfig, TinyModelConfig
from asyncrl.core.model.tokenizer import ModelTokenizer, build_char_tokenizer, save_tokenizer
from asyncrl.tools.tiny_model import make_tiny_model, model_config
from asyncrl.tools.tiny_model_stamp import STAMP_FILE, config_stamp, sft_peak_lr


def test_tokenizer_round_trip():
    codec = ModelTokenizer.arith()
    for text in ["0+0=", "12+34=", "999+1=1000"]:
        ids = codec.encode_prompt(text)
        assert ids[0] == codec.bos_id and len(ids) == len(text) + 1  # one token per character
        assert codec.hf.decode(ids, skip_special_tokens=True) == text
    assert codec.decode_response(codec.encode_text("46") + [codec.eos_id, codec.pad_id]) == "46"
    assert codec.vocab_size == 16 and (codec.pad_id, codec.bos_id, codec.eos_id) == (0, 1, 2)


def test_saved_tokenizer_loads_with_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = build_char_tokenizer()
    codec = ModelTokenizer.from_tokenizers(tok)
    save_tokenizer(tok, tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf("12+34=").input_ids == codec.encode_prompt("12+34=")
    assert (hf.eos_token, hf.pad_token, hf.bos_token) == ("<eos>", "<pad>", "<bos>")
    assert (hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (codec.eos_id, codec.pad_id, codec.bos_id)
    assert hf.decode(codec.encode_prompt("7+8=") + [codec.eos_id], skip_special_tokens=True) == "7+8="
    assert len(hf) == codec.vocab_size
    assert ModelTokenizer.load(tmp_path).encode_prompt("5+5=") == codec.encode_prompt("5+5=")


def test_bad_alphabet_is_rejected():
    with pytest.raises(ValueError, match="distinct"):
        build_char_tokenizer("0011")


def test_head_size_must_be_64():
    codec = ModelTokenizer.arith()
    with pytest.raises(ValueError, match="must be 64"):
        model_config(TinyModelConfig(hidden_size=128, num_attention_heads=4), codec)
    cfg = model_config(TinyModelConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2), codec)
    assert cfg.head_dim == 64 and cfg.vocab_size == codec.vocab_size and cfg.eos_token_id == codec.eos_id


def test_built_checkpoints_load_and_are_cached(tiny_model_dir, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for path in (tiny_model_dir.policy, tiny_model_dir.teacher):
        assert (path / "model.safetensors").is_file()
        model = AutoModelForCausalLM.from_pretrained(str(path))
        assert model.dtype == torch.float32
        assert model.config.hidden_size // model.config.num_attention_heads == 64
        assert AutoTokenizer.from_pretrained(str(path)).eos_token_id == model.config.eos_token_id
        stamp = json.loads((path / STAMP_FILE).read_text())
        assert stamp["stamp"] == config_stamp(tiny_model_dir.config)
    policy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir.policy))
    teacher = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir.teacher))
    assert not torch.equal(policy.lm_head.weight, teacher.lm_head.weight)  # the teacher trained further
    # Same config again: nothing is rebuilt.
    assert make_tiny_model(tiny_model_dir.config).built is False


def test_stamp_follows_the_config():
    base = AsyncRLConfig()
    changed = AsyncRLConfig.model_validate(
        {"tiny_model": {"warmstart_steps": base.tiny_model.warmstart_steps + 1}}
    )
    other_task = AsyncRLConfig.model_validate({"task": {"seed": 5}})
    assert config_stamp(base) == config_stamp(AsyncRLConfig())
    assert len({config_stamp(base), config_stamp(changed), config_stamp(other_task)}) == 3


@pytest.mark.parametrize(("width", "rate"), [(64, 1e-3), (128, 1e-3), (256, 5e-4), (512, 2.5e-4), (896, 1e-3 / 7)])
def test_a_wider_model_warms_up_at_a_rate_scaled_down_by_its_width(width, rate):
    assert sft_peak_lr(width) == pytest.approx(rate, rel=1e-12)


def test_the_stamp_holds_the_rate_a_model_of_its_width_trains_at(monkeypatch):
    """The demo's width keeps its stamp (its checkpoints are not built again); a wider model's changes with its
    rate, so a checkpoint warm-started at the old rate is not taken for a current one."""
    from asyncrl.tools import tiny_model_stamp

    wide = AsyncRLConfig.model_validate({"tiny_model": {"hidden_size": 512, "num_attention_heads": 8}})
    stamps = {config_stamp(AsyncRLConfig()), config_stamp(wide)}
    monkeypatch.setattr(tiny_model_stamp, "sft_peak_lr", lambda width: tiny_model_stamp.SFT_LR)  # the old rule
    assert config_stamp(AsyncRLConfig()) in stamps and config_stamp(wide) not in stamps


def test_teacher_must_train_at_least_as_long(tmp_path):
    cfg = AsyncRLConfig.model_validate(
        {
            "model": {"path": str(tmp_path / "p")},
            "teacher": {"enabled": True, "model_path": str(tmp_path / "t")},
            "tiny_model": {"warmstart_steps": 5, "teacher_steps": 2},
        }
    )
    with pytest.raises(ValueError, match="teacher_steps"):
        make_tiny_model(cfg)


def test_moe_architecture_builds_a_qwen3_moe_with_routers():
    from transformers import AutoModelForCausalLM

    from asyncrl.core.model.routing import routing_shape

    codec = ModelTokenizer.arith()
    shape = TinyModelConfig(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    config = model_config(shape, codec)
    assert config.model_type == "qwen3_moe" and config.norm_topk_prob and config.head_dim == 64
    routing = routing_shape(AutoModelForCausalLM.from_config(config))
    assert (routing.num_layers, routing.top_k, routing.num_experts) == (2, 2, 8)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        model_config(TinyModelConfig(architecture="qwen3_moe", num_experts=2, num_experts_per_tok=3), codec)


@pytest.mark.parametrize(("accuracies", "steps", "measured"), [
    ([0.1, 0.2, 0.5], 13 + 5 + 5, 0.5),  # reaches the target at the third check
    ([0.1] * 10, 2 * 13, 0.1),           # never does: stops at twice warmstart_steps (13 + 5 + 5 + 3)
    ([0.9], 13, 0.9),                    # already there after warmstart_steps
], ids=["reached", "capped", "at-once"])
def test_the_warm_start_goes_on_until_its_accuracy_target(accuracies, steps, measured):
    from asyncrl.core.tasks import get_task
    from asyncrl.tools import tiny_model

    cfg = AsyncRLConfig.model_validate({"tiny_model": {"warmstart_steps": 13, "warmstart_until_accuracy": 0.5}})
    codec = ModelTokenizer.arith()
    task = get_task(cfg.task, codec, cfg.reward)
    trained: list[tuple[int, int]] = []
    real = tiny_model.supervised_train

    def counting(model, task, n, first_step=0, *args, **kwargs):
        trained.append((first_step, n))
        return real(model, task, n, first_step, *args, **kwargs)

    checks = iter(accuracies)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(model_config(TinyModelConfig(num_hidden_layers=1), codec))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny_model, "supervised_train", counting)
        _, taken, last = tiny_model.warm_start(model, task, cfg.tiny_model, lambda: next(checks))
    assert (taken, last) == (steps, measured)
    # Contiguous chunks: each continues the run where the last stopped (new data, same optimizer).
    assert [first for first, _ in trained] == [0, *[sum(n for _, n in trained[:i]) for i in range(1, len(trained))]]
    assert sum(n for _, n in trained) == steps


def test_a_teacher_must_outlast_the_longest_warm_start(tmp_path):
    cfg = AsyncRLConfig.model_validate({
        "model": {"path": str(tmp_path / "p")}, "teacher": {"enabled": True, "model_path": str(tmp_path / "t")},
        "tiny_model": {"warmstart_steps": 5, "teacher_steps": 8, "warmstart_until_accuracy": 0.5}})
    with pytest.raises(ValueError, match=r"teacher_steps \(8\) must be >= the longest warm start \(10"):
        make_tiny_model(cfg)
