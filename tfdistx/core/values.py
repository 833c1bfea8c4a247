"""What a value from a config or a run's files is, as plain data. Python
counts True as 1, so a key that takes a number must refuse `true`: these
checks say so once, for every side (no Hydra, no TensorFlow here)."""

import math


def is_whole(value) -> bool:
    """A whole number (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite number, whole or not (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
