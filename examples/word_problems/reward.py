"""A user reward for the word-problems example, named in the config as
`examples/word_problems/reward.py:bare_number`: the response is just a number, nothing around it.

A reward is any function `fn(response_text, metadata) -> float`; `metadata` holds the dataset row's other
fields (here `answer` and `operation`). Raising is allowed: the sample scores 0 and the error is counted.
"""

import re


def bare_number(response: str, metadata: dict) -> float:
    return 1.0 if re.fullmatch(r"-?\d+", response.strip()) else 0.0
