"""The names a weight push can take, apart from the code that implements them: the config schema and the
controller check plans against these without loading torch (a controller or a config tool that imported the
data plane paid about a second of start-up for it)."""

from __future__ import annotations

from typing import Literal, get_args

Transport = Literal["gloo", "nccl"]
"""Data planes of the weight push: gloo (CPU tensors) or nccl (GPU tensors)."""
TRANSPORTS: tuple[str, ...] = get_args(Transport)

DeltaSetting = Literal["none", "xor-zlib"]
"""`weight_transport.delta_codec`: no delta, or a codec (`asyncrl.core.weights.delta`)."""
CODECS: tuple[str, ...] = tuple(c for c in get_args(DeltaSetting) if c != "none")
"""Delta encodings a push may use (a plan names one, or "")."""
