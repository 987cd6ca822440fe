"""Errors that name what is wrong: request checks raising `InvalidArgument` naming the field, and `ConfigError` naming the key."""
