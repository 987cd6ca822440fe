"""A config value that cannot work, reported as one line naming the key: `ConfigError`, and the line every
`asyncrl` command prints when it refuses a config."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the key."""


def refusal_line(command: str, message: str) -> str:
    """How every `asyncrl` command reports a config it refuses (one line, then exit code 2)."""
    return f"asyncrl {command}: config error: {message}"


def refusal_of(command: str, line: str) -> str | None:
    """The message of `refusal_line(command, ...)`, or None for any other line."""
    prefix = refusal_line(command, "")
    return line.removeprefix(prefix) if line.startswith(prefix) else None
