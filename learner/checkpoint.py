"""Keeping what the learner trained: `<run_dir>/checkpoints/step-NNNNNN/` every `save_every` steps and at the end.

Each checkpoint directory holds
- `learner/`: model and optimizer state with `torch.distributed.checkpoint` (state dicts from `get_state_dict`:
  a sharded learner writes one file per rank, and any number of ranks loads them), and `rng.pt`, the
  leader's RNG states;
- with LoRA (`learner.lora`), `learner/` holds the adapters' state only (the base is `model.path`, frozen), and
  `adapter/` the adapter in peft's format (`learner.adapters.save_adapter`), which `PeftModel.from_pretrained`
  and vLLM's LoRA loader read; `hf/` is then the merged policy;
- `hf/` (`export_hf`): the policy as a Hugging Face checkpoint (safetensors, config, generation config, the
  tokenizer with its special tokens and chat template) that `transformers` and vLLM load as they are;
- `config.resolved.yaml` and `meta.json` (step, version, data position, time);
- `covered.json`: the buffer entries trained since the checkpoint before, which this one holds and the
  learner acknowledges once it is in place (`ack_covered`), and their group ids (a learner resumed from the
  checkpoint refuses a second copy of one of those groups, as the learner that trained it would have).

A checkpoint is written under a temporary name and renamed when complete, so `latest` never returns half a
checkpoint; once it is in place the oldest beyond `keep_last` are deleted.

The acknowledgement comes after the rename, so a learner can die between the two (killed, or Redis down for
the ack): its entries are then still pending though the checkpoint holds what they trained. Whoever continues
from the checkpoint (`asyncrl up --resume`, a restarted learner) acknowledges them first with `ack_covered`,
so they are not trained twice; entries of a newer checkpoint that was not resumed from are trained again, as
its weights were.
"""

from __future__ import annotations

import json
import pickle
import random
import shutil
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from asyncrl.core.config.file import dump_config
from asyncrl.learner.adapters import DEFAULT_RUN, lora_parameters, merged_state_dict, save_adapter
from asyncrl.learner.checkpoint_index import (
    COVERED,
    NOTHING_COVERED,
    PREFIX,
    CheckpointMeta,
    Covered,
    checkpoints_dir,
    list_checkpoints,
    read_meta,
)
from asyncrl.learner.heap import trim_heap
from asyncrl.learner.sharding import SAVE, SINGLE, STAGE, Ranks

_ONE_EXPORT_AT_A_TIME = threading.Lock()
"""A merged export holds a host copy of the whole policy until it is written: the runs sharing one base
(`learner.runs`), whose checkpoints are written on threads of their own, write theirs one after another."""


class Checkpointer:
    def __init__(self, config, tokenizer, ranks: Ranks = SINGLE, export_model=None, adapter=None,
                 run: str = DEFAULT_RUN):
        self.config, self.cfg = config, config.learner.checkpoint
        self.tokenizer = tokenizer
        """A `transformers` tokenizer (the policy's), saved with every Hugging Face export."""
        self.ranks = ranks
        self.export_model = export_model
        """The unsharded policy the Hugging Face export reads (the leader's mirror); None: the model saved."""
        self.adapter = adapter
        """A LoRA learner's adapter shape (`AdapterSpec`): the adapter is saved in peft's format and the export
        is the merged policy."""
        self.run = run
        """Whose adapter a LoRA checkpoint exports (several runs share one base: `learner.runs`)."""

    def save(self, model, optimizer, meta: CheckpointMeta, covered: Covered = NOTHING_COVERED) -> Path:
        """Write a checkpoint of the live state, in line, naming what it `covered`. (The leader; every other
        rank saves its shards when told, `sharding.follow`.)"""
        tmp, final = self._begin(meta)
        if self.ranks.sharded:
            self.ranks.broadcast((SAVE, str(tmp / "learner")))
        save_shards(str(tmp / "learner"), model, optimizer)
        self._write_exports(self.export_model or model, tmp)
        return self._finish(tmp, final, rng_state(), meta, covered)

    def _write_exports(self, module, tmp: Path, state: dict | None = None) -> None:
        """LoRA: `adapter/` from `state` (peft name -> tensor) and the merged policy in `hf/`; else the policy
        `state` in `hf/` (only with `export_hf`). `state` None: the module's own, now."""
        if self.adapter is not None:
            adapter = dict(lora_parameters(module, self.run)) if state is None else state
            save_adapter(tmp / "adapter", self.adapter, list(adapter.items()), self.config.model.path)
        if not self.cfg.export_hf:
            return
        with _ONE_EXPORT_AT_A_TIME:
            if self.adapter is not None:
                state = merged_state_dict(module, self.adapter, adapter)
            export_hf(module, self.tokenizer, tmp / "hf", state)
            del state
            trim_heap()  # the merged copy, freed on this checkpoint thread, would stay in its arena

    def stage(self, model, optimizer, meta: CheckpointMeta, covered: Covered = NOTHING_COVERED) -> StagedCheckpoint:
        """A copy in host memory of everything a checkpoint holds, taken now, for `write` to put on disk later
        while training goes on (`learner.checkpoint.background`). On a sharded learner every rank copies its
        shards when told (`sharding.follow`, STAGE) and the leader also copies its mirror for the export."""
        tmp, final = self._begin(meta)
        if self.ranks.sharded:
            self.ranks.broadcast((STAGE, str(tmp / "learner")))
        state = stage_shards(model, optimizer)
        exported = self.export_model or model
        hf_state = None
        if self.adapter is not None:  # the base is frozen: the merge reads it live when the copy is written
            hf_state = _host_copy(dict(lora_parameters(exported, self.run)))
        elif self.cfg.export_hf:
            hf_state = state["model"] if exported is model else _host_copy(exported.state_dict())
        return StagedCheckpoint(meta, state, rng_state(), exported, hf_state, tmp, final, covered)

    def write(self, staged: StagedCheckpoint) -> Path:
        """Put a staged checkpoint on disk: the same files as `save`, from the copy, not the live model (on a
        sharded learner, together with every rank's write of its shards)."""
        write_shards(str(staged.tmp / "learner"), staged.state, self.ranks)
        if staged.hf_state is not None:
            self._write_exports(staged.module, staged.tmp, staged.hf_state)
        return self._finish(staged.tmp, staged.final, staged.rng, staged.meta, staged.covered)

    def _begin(self, meta: CheckpointMeta) -> tuple[Path, Path]:
        root = checkpoints_dir(self.config.run_dir)
        final = root / f"{PREFIX}{meta.step:06d}"
        tmp = root / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        return tmp, final

    def _finish(self, tmp: Path, final: Path, rng: dict, meta: CheckpointMeta, covered: Covered) -> Path:
        torch.save(rng, tmp / "learner" / "rng.pt")
        dump_config(self.config, tmp / "config.resolved.yaml")
        (tmp / COVERED).write_text(json.dumps({"entry_ids": list(covered.entry_ids),
                                               "group_ids": list(covered.group_ids)}))
        (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(self.config.run_dir)[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final


@dataclass(frozen=True)
class StagedCheckpoint:
    """What `Checkpointer.stage` copied: this rank's model and optimizer state (host tensors, the layout
    `get_state_dict` gives and `load_shards` reads), the RNG states, the full policy for the Hugging Face
    export (None: no export) with the module whose config and `save_pretrained` it uses, and where it goes."""

    meta: CheckpointMeta
    state: dict
    rng: dict
    module: object
    hf_state: dict | None
    """The export's state (None: no export); with LoRA the adapter's tensors (peft names), merged when written."""
    tmp: Path
    final: Path
    covered: Covered = NOTHING_COVERED
    """What it trained since the checkpoint before (`covered.json`)."""


def _host_copy(value, copies: dict | None = None):
    """`value` with every tensor in it copied to host memory, contiguous (containers rebuilt, other leaves
    shared: they are immutable). A tensor named twice (a tied embedding is both `model.embed_tokens.weight` and
    `lm_head.weight` in the state dict) is copied once and stays one tensor under both names: a 0.5B model's
    staged checkpoint was 0.5 GiB larger for it (bench/learner_memory.py)."""
    copies = {} if copies is None else copies
    if isinstance(value, torch.Tensor):
        # A plain tensor is known by its memory; a tensor subclass (a sharded learner's DTensor, whose
        # data_ptr is not its shard's) only by itself.
        plain = type(value) in (torch.Tensor, torch.nn.Parameter)
        key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride()) if plain else id(value)
        if key not in copies:
            copies[key] = value.detach().to("cpu", copy=True).contiguous()
        return copies[key]
    if isinstance(value, dict):
        return type(value)((key, _host_copy(item, copies)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_host_copy(item, copies) for item in value)
    return value


def export_hf(model, tokenizer, directory: Path, state: dict | None = None) -> None:
    """The policy as a standalone Hugging Face checkpoint: `model`'s config with `state` (a staged copy; None:
    a copy of the model's own now). The learner's parameters are views into shared bucket storage (for
    zero-copy pushes), which safetensors would take for tied weights: it saves copies."""
    state = _host_copy(model.state_dict()) if state is None else state
    state = {name: value for name, value in state.items() if name not in tied_copies(model)}
    model.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(str(directory))


def tied_copies(model) -> set[str]:
    """The state-dict names of the output embedding when the model ties it to the input one
    (`tie_word_embeddings`): one tensor under two names, written once. The staged copies no longer share
    storage, so without this `save_pretrained` writes both (0.5 GB more for Qwen2.5-0.5B)."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or outputs is None or inputs.weight is not outputs.weight:
        return set()
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if p is outputs.weight}
    return tied - {name for name, p in model.named_parameters() if p is inputs.weight}


TRAINED_ONLY = StateDictOptions(ignore_frozen_params=True)
"""The learner state holds what trains: every weight of a full run, the adapters of a LoRA run (the base is the
frozen `model.path`)."""


def save_shards(path: str, model, optimizer) -> None:
    """Model and optimizer state into `path` with torch.distributed.checkpoint: on a sharded learner every
    rank writes its shards (all ranks call this together); the files are the same whatever the rank count."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINED_ONLY)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path, no_dist=_no_dist())


def stage_shards(model, optimizer) -> dict:
    """This rank's model and optimizer state, copied to host memory (what `write_shards` writes)."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINED_ONLY)
    return _host_copy({"model": model_sd, "optim": optim_sd})


def write_shards(path: str, state: dict, ranks: Ranks) -> None:
    """`stage_shards`'s copy into `path`: on a sharded learner every rank calls this together, on its checkpoint
    thread, over `ranks.checkpoint_group` (the default group is the training's meanwhile)."""
    if ranks.sharded:
        dcp.save(state, checkpoint_id=path, process_group=ranks.checkpoint_group)
    else:
        dcp.save(state, checkpoint_id=path, no_dist=_no_dist())


def load_shards(path: str, model, optimizer) -> None:
    """Model and optimizer state from `path` (saved by any number of ranks) into this rank's shards (all
    ranks call this together)."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINED_ONLY)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path, no_dist=_no_dist())
    # dcp.load refused a checkpoint lacking any trained tensor; the frozen base is not in it (not strict).
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))


def load_checkpoint(path: str | Path, model, optimizer) -> CheckpointMeta:
    """Restore model, optimizer and RNG states from `<path>/learner`; returns the saved progress."""
    load_shards(str(Path(path) / "learner"), model, optimizer)
    set_rng_state(read_rng_state(Path(path) / "learner" / "rng.pt"))
    return read_meta(path)


def _no_dist() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


def rng_state() -> dict:
    """The RNG states as tensors and plain values only, so that reading them back needs no unpickling of
    arbitrary objects (`read_rng_state`)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }


def read_rng_state(path: Path) -> dict:
    """`rng.pt` read with the weights-only loader: a checkpoint directory is data, never code. A file holding
    anything else (a pickled object that would run code, the numpy array an older asyncrl saved) is refused
    with a ValueError naming it."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path}: not a plain RNG state (only tensors and plain values are loaded from a "
                         f"checkpoint): {str(err).splitlines()[0]}") from None


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
