"""The learner's own secret: what proves, at `Controller.RegisterLearner`, that the caller is the run's learner.

The shared token admits every process of a run, replicas included, so it cannot decide who trains: with the
token alone, a process that asked for the seat while the learner was down (a crash, a restart) took it, reset
the run to version 0 and pushed its own weights to every replica. The seat now needs a second secret that only
the controller and the learner hold (`security.learner_secret_file`, else the environment variable
`security.learner_secret_env`; `asyncrl up` makes one per run; the deploy manifests give it to those two
alone). A registration carries `seat_proof(secret, address, issued_unix_s, nonce)` with a fresh random nonce;
the controller takes a proof only within `PROOF_WINDOW_S` of its clock and only once (`SeatProofs`), so one seen
on the wire cannot be replayed.
"""

from __future__ import annotations

import hmac
import secrets
import time

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.wire.auth import read_secret

PROOF_WINDOW_S = 120.0
"""How far a proof's issue time may be from the controller's clock (clock skew between hosts included)."""


class MissingLearnerSecret(ConfigError):
    """No learner secret configured (and not `security.insecure`)."""


def resolve_learner_secret(security) -> bytes | None:
    """The learner secret of `security` (a SecurityConfig): the file, else the environment variable; None only
    with `security.insecure` (then any token holder may take the seat, as before the secret existed)."""
    secret = read_secret(security, "learner_secret", MissingLearnerSecret,
                         "on the controller and the learner (asyncrl up makes one per run; deploy/ gives it to "
                         "those two only), or security.insecure: true")
    return None if secret is None else secret.encode()


def seat_proof(secret: bytes, address: str, issued_unix_s: int, nonce: bytes) -> bytes:
    """HMAC-SHA256 under the learner secret of "seat", the learner's address, the issue time and the nonce (in
    lower-case hex), one per line."""
    return hmac.new(secret, f"seat\n{address}\n{issued_unix_s}\n{nonce.hex()}".encode(), "sha256").digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(16)


class SeatProofs:
    """The controller's check of registrations: right secret, fresh, never seen before."""

    def __init__(self, secret: bytes | None, wall_clock=time.time):
        self._secret, self._wall = secret, wall_clock
        self._seen: dict[bytes, float] = {}
        """Proofs taken, until they leave the window."""

    def check(self, address: str, issued_unix_s: int, proof: bytes, nonce: bytes) -> str:
        """"" when the proof is good (and remember it), else why not, starting with the request field."""
        if self._secret is None:
            return ""
        now = self._wall()
        self._seen = {seen: until for seen, until in self._seen.items() if until > now}
        if not proof:
            return ("seat_proof: missing; only the run's learner, which holds the learner secret "
                    "(security.learner_secret_*), may take the seat")
        if abs(now - issued_unix_s) > PROOF_WINDOW_S:
            return (f"proof_unix_s: {issued_unix_s} is more than {PROOF_WINDOW_S:g} s from the controller's clock "
                    f"({now:.0f})")
        if not hmac.compare_digest(proof, seat_proof(self._secret, address, issued_unix_s, nonce)):
            return "seat_proof: not made with the run's learner secret (security.learner_secret_*)"
        if proof in self._seen:
            return "seat_proof: already used; a learner makes a new one for every registration"
        self._seen[proof] = now + 2 * PROOF_WINDOW_S
        return ""
