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


def validation_line(err) -> str:
    """A pydantic `ValidationError` as one line: each error's key path, then its message (a check across
    sections, with no path, names its keys in its message)."""
    return "; ".join(".".join(str(p) for p in e["loc"]) + ": " * bool(e["loc"]) + e["msg"].removeprefix("Value error, ")
                     for e in err.errors())
