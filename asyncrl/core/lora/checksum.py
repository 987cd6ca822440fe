"""The checksum of an adapter: what the learner sent and what a replica's engine serves, compared at every
commit (a push that did not take effect is an error, not a silent no-op) and shown on the status page. The same
checksum as a full-weight push's (`asyncrl.core.checks.weights_checksum`)."""

from __future__ import annotations

from asyncrl.core.checks.weights_checksum import weights_checksum as adapter_checksum

__all__ = ["adapter_checksum"]
