"""The agent demo's tool (examples/tool-agent.yaml): a plain Python function, named in the config as
`examples/agent/tools.py:add`. Its type hints and docstring are its JSON schema for the chat template."""


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return int(a) + int(b)
