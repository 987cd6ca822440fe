"""The learner's algorithm configuration (`learner.algo`): part of the one config schema, so it lives in the
core beside it; the functions it configures are in `asyncrl.learner.algos`."""

from asyncrl.core.algo.config import AlgoConfig
from asyncrl.core.algo.presets import PRESET_NAMES, PRESETS

__all__ = ["PRESETS", "PRESET_NAMES", "AlgoConfig"]
