"""How `asyncrl up` starts the services on one machine (`launch`)."""

from __future__ import annotations

from typing import Literal

from asyncrl.core.config.base import Section


class LaunchConfig(Section):
    services: Literal["fork", "spawn"] = "fork"
    """How `asyncrl up` starts the services on this machine. fork: from one fork server that imported torch,
    transformers and the services' modules once (a run's first step in half the time on two cores, where five
    interpreters importing them at once take 2.5-3 times as long as one); spawn: each in a fresh interpreter.
    Containers and Kubernetes start each service themselves, whatever this says."""
