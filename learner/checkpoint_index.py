"""Where a run's checkpoints are and what each holds and covers, read without torch (`asyncrl up` and its
supervisor ask before any process of the run has loaded it; the format is `learner.checkpoint`'s)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.config.learner import CheckpointConfig
from asyncrl.core.records.learner import CoveredAcked

PREFIX = "step-"
COVERED = "covered.json"


@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    version: int
    data_position: int
    """One past the highest prompt index trained on."""
    saved_unix_s: float


@dataclass(frozen=True)
class Covered:
    """What a checkpoint trained since the checkpoint before: the buffer entries and their groups."""

    entry_ids: tuple[str, ...] = ()
    group_ids: tuple[str, ...] = ()


NOTHING_COVERED = Covered()


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").is_file())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def resume_path(cfg: CheckpointConfig, run_dir: str | Path) -> str:
    """The checkpoint `cfg.resume_from` names: a path, "latest" (the newest complete one under `run_dir`, ""
    when there is none yet), or "" (start from model.path)."""
    wanted = cfg.resume_from
    if wanted != "latest":
        return wanted
    found = latest_checkpoint(run_dir)
    return str(found) if found is not None else ""


def read_meta(path: str | Path) -> CheckpointMeta:
    return CheckpointMeta(**json.loads((Path(path) / "meta.json").read_text()))


def read_covered(path: str | Path) -> Covered:
    """What checkpoint `path` covers (nothing for one written before checkpoints named it)."""
    file = Path(path) / COVERED
    if not file.is_file():
        return NOTHING_COVERED
    saved = json.loads(file.read_text())
    return Covered(tuple(saved["entry_ids"]), tuple(saved["group_ids"]))


def ack_covered(buffer, path: str | Path, events) -> Covered:
    """Acknowledge the entries checkpoint `path` covers that are still pending (its learner died between the
    rename and the acknowledgement), recorded as `covered_acked` when there were any; returns what the
    checkpoint covers. Acknowledging twice changes nothing, so whoever continues from the checkpoint calls
    this first, however the previous learner ended."""
    covered = read_covered(path)
    acked = buffer.ack(list(covered.entry_ids)) if covered.entry_ids else 0
    if acked:
        events.write(CoveredAcked(path=str(path), acked=acked, covered=len(covered.entry_ids)))
    return covered
