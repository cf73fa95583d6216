"""The package's argument checks: one set of rules for integer arguments (private).

Every integer argument is read with :func:`check_int` (or a helper built on it): a value
that is not an integer -- a bool, a float, a string, None where None is not allowed --
raises ``TypeError``; an integer out of range raises ``ValueError``. Both name the
argument, what was expected and what was got, as the error model promises (docs/concepts.md).
numpy integers and anything with ``__index__`` count as integers. Timeouts have their own
parser, :func:`tensorxfer.errors.check_timeout`.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1


def _describe(minimum: Optional[int], maximum: Optional[int], multiple_of: Optional[int]) -> str:
    if minimum is not None and maximum is not None:
        text = f"an integer in [{minimum}, {maximum}]"
    elif minimum is not None:
        text = f"an integer >= {minimum}"
    elif maximum is not None:
        text = f"an integer <= {maximum}"
    else:
        text = "an integer"
    if multiple_of is not None:
        text += f" and a multiple of {multiple_of}"
    return text


def _integer(value: Any, argument: str, expected: str) -> int:
    """``value`` as an int (``operator.index``); TypeError naming ``argument`` and ``expected`` for
    anything else, bool included."""
    if isinstance(value, bool):
        raise TypeError(f"{argument}: expected {expected}, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{argument}: expected {expected}, got {type(value).__name__}") from None


def check_int(value: Any, argument: str, minimum: Optional[int] = None, maximum: Optional[int] = None,
              multiple_of: Optional[int] = None) -> int:
    """``value`` as an int in [minimum, maximum] (a bound of None: unbounded), a multiple of
    ``multiple_of`` if given. TypeError for a non-integer (bool included), ValueError out of
    range, both naming ``argument``."""
    expected = _describe(minimum, maximum, multiple_of)
    number = _integer(value, argument, expected)
    if ((minimum is not None and number < minimum) or (maximum is not None and number > maximum)
            or (multiple_of is not None and number % multiple_of)):
        raise ValueError(f"{argument}: expected {expected}, got {number}")
    return number


def check_optional_int(value: Any, argument: str, minimum: Optional[int] = None,
                       maximum: Optional[int] = None) -> Optional[int]:
    """None, or check_int(value, ...) (the message says None is accepted too)."""
    if value is None:
        return None
    try:
        return check_int(value, argument, minimum, maximum)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{error} (or None)") from None


def check_rank(value: Any, world_size: int, argument: str) -> int:
    """``value`` as a rank in [0, world_size) (the messages the native submits give too)."""
    rank = _integer(value, argument, "an integer rank")
    if not 0 <= rank < world_size:
        raise ValueError(f"{argument}: expected a rank in [0, {world_size}), got {rank}")
    return rank


def check_task_id(value: Any, argument: str = "task_id") -> Optional[int]:
    """A task id: None or a 64-bit signed integer (the messages the native submits give too)."""
    if value is None:
        return None
    task_id = _integer(value, argument, "an integer or None")
    if not INT64_MIN <= task_id <= INT64_MAX:
        raise ValueError(f"{argument}: expected a 64-bit signed integer, got {task_id}")
    return task_id


__all__ = ["INT64_MAX", "INT64_MIN", "UINT64_MAX", "check_int", "check_optional_int", "check_rank", "check_task_id"]
