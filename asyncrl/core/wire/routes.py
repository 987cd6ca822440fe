"""Which of this host's addresses a peer reaches it at: the address of the interface that routes to the peer.
A host's name resolves to 127.0.1.1 on Debian, and a host with several networks has an address on each, so
neither the name nor "any address" tells a peer where to connect back (a replica registering with the
controller, a push group's members announcing themselves to each other)."""

from __future__ import annotations

import socket


def route_address(peer_host: str) -> str | None:
    """This host's address on the route to `peer_host` (a UDP socket's connect sends nothing); None when there
    is no route or the name does not resolve."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((peer_host, 9))
            return probe.getsockname()[0]
    except OSError:
        return None
