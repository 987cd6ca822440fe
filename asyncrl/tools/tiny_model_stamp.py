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
SFT_WARMUP_STEPS = 20
# The teacher phase decays the learning rate linearly to this fraction: a settled, stronger model. The warm
# start stops mid-run at the full rate on purpose (an imperfect policy is what RL should improve).
SFT_TEACHER_FINAL_LR = 0.05
# With tiny_model.warmstart_until_accuracy: supervised steps between two checks of the greedy accuracy.
WARMSTART_CHECK_STEPS = 5


def config_stamp(config) -> str:
    """Hash of everything that determines the checkpoints (tiny_model + task sections, the tokenizer files)."""
    payload = {
        "tiny_model": config.tiny_model.model_dump(mode="json"),
        "task": config.task.model_dump(mode="json"),
        # What shapes the reference episodes: not the tools' paths (the bench's slow `add` adds as the demo's
        # does) nor the run-time limits.
        "environment": config.environment.model_dump(mode="json", include={"type", "tool_call_format"}),
        "recipe": [SFT_BATCH_SIZE, SFT_LR, SFT_WARMUP_STEPS, SFT_TEACHER_FINAL_LR, WARMSTART_CHECK_STEPS],
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
