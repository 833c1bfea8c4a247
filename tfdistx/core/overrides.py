"""The command line's overrides read as the plain strings they are
(`key=value`), for the code that must know one before (or without) Hydra
composing them: the config side's refusals, the manifests' pod arguments."""

from typing import Optional, Sequence


def given_value(key: str, overrides: Sequence[str]) -> Optional[str]:
    """The value the command line gives `key` (as `key=`, `+key=`, `++key=`), or None."""
    for override in reversed(overrides):  # the last one given is the one composed
        name, _, value = override.lstrip("+~").partition("=")
        if name == key:
            return value
    return None
