"""Whether the tiny demo checkpoints are current, decided without torch (`asyncrl up` asks before every run,
and building them is `asyncrl.tools.tiny_model`'s): a stamp file beside each checkpoint holds a hash of
everything that determines it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

STAMP_FILE = "asyncrl-tiny-model.json"
# Supervised warm start: fixed recipe (not config) so the step counts alone set the policy's strength.
SFT_BATCH_SIZE = 64
SFT_LR = 1e-3
SFT_LR_WIDTH = 128
"""The model width SFT_LR was tuned at (the demo's): a wider model trains at SFT_LR x SFT_LR_WIDTH / width
(`sft_peak_lr`)."""
SFT_WARMUP_STEPS = 20
# The teacher phase decays the learning rate linearly to this fraction: a settled, stronger model. The warm
# start stops mid-run at the full rate on purpose (an imperfect policy is what RL should improve).
SFT_TEACHER_FINAL_LR = 0.05
# With tiny_model.warmstart_until_accuracy: supervised steps between two checks of the greedy accuracy.
WARMSTART_CHECK_STEPS = 5


def sft_peak_lr(width: int) -> float:
    """The supervised rate of a model `width` wide. Adam moves every weight by about the rate, so a layer's
    output moves with width x rate: held at the demo's rate, a 512-wide model's warm start stalled at 0.03-0.09
    held-out accuracy after 900 steps on two CPUs of three."""
    return SFT_LR * min(1.0, SFT_LR_WIDTH / width)


def config_stamp(config) -> str:
    """Hash of everything that determines the checkpoints (tiny_model + task sections, the tokenizer files)."""
    payload = {
        "tiny_model": config.tiny_model.model_dump(mode="json"),
        "task": config.task.model_dump(mode="json"),
        # What shapes the reference episodes: not the tools' paths (the bench's slow `add` adds as the demo's
        # does) nor the run-time limits.
        "environment": config.environment.model_dump(mode="json", include={"type", "tool_call_format"}),
        "recipe": [SFT_BATCH_SIZE, sft_peak_lr(config.tiny_model.hidden_size), SFT_WARMUP_STEPS,
                   SFT_TEACHER_FINAL_LR, WARMSTART_CHECK_STEPS],
    }
    if config.tiny_model.tokenizer_path:
        files = sorted(p for p in Path(config.tiny_model.tokenizer_path).glob("*") if p.is_file())
        payload["tokenizer"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def stamp_matches(directory: Path, stamp: str) -> bool:
    path = directory / STAMP_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("stamp") == stamp
    except (OSError, ValueError):
        return False


def tiny_models_current(config) -> bool:
    """The policy at `model.path` (and the teacher at `teacher.model_path` when it is enabled) carry the stamp
    of `config`: building them again would be a no-op."""
    stamp = config_stamp(config)
    return stamp_matches(Path(config.model.path), stamp) and (
        not config.teacher.enabled or stamp_matches(Path(config.teacher.model_path), stamp))
