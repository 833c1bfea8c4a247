"""The one room for the internals: every private API of TensorFlow, Keras,
Hydra and Python that tfdistx uses is a small named function or constant in
one of this package's modules, and nowhere else (tests/test_unit_internals.py
scans the package for them):

- `tensorflow`: TensorFlow's and Keras' (it imports TensorFlow, never Hydra);
- `hydra`: Hydra's (no TensorFlow);
- `python`: the standard library's.

Each says what the internal is, why there is no public way, and the versions
it was checked on. A private API can go in any release, so each module has a
`probe()` that looks for every internal it wraps (attributes and imports
only: no TensorFlow op) where the work is about to start: TensorFlow's
when tfdistx imports it (engine/quiet_import.py), Hydra's before a command
composes, Python's when the process starts. A missing one stops the command
in one line naming the package, its version and the internal, with exit
code 8 (EXIT_UNSUPPORTED_VERSION), rather than a run that breaks later or,
worse, trains on wrongly. What can only be seen on a built object (a Keras
optimizer's lists, the names Keras gives variables) is checked where it is
used, with the same line, and by the tests on real objects.

Moving the pinned versions: pyproject.toml pins the minors the room was
checked on (PINS below says the same, and a test holds them equal). To
move one: install the new version, run `pytest tests/test_unit_internals.py -n 0`
(every probe, and every internal checked on real TensorFlow and Keras
objects) and then the whole suite; mend what fails here, in the room; then
widen the pin in pyproject.toml and PINS together, and note the version in
the comments of the internals checked on it.
"""

import importlib
from dataclasses import dataclass
from typing import Any, Optional

from tfdistx.core.errors import EXIT_UNSUPPORTED_VERSION, RunFault

# The requirement each wrapped distribution is pinned to in pyproject.toml: what the probes' lines tell to install.
PINS = {
    "tensorflow": "tensorflow==2.21.0",
    "keras": "keras>=3.15,<3.16",
    "hydra-core": "hydra-core>=1.3.2,<1.4",
    "python": "CPython>=3.10",
}
_NAMES = {"tensorflow": "TensorFlow", "keras": "Keras", "hydra-core": "Hydra", "python": "Python"}


class Gone(RunFault):
    """An internal this installed TensorFlow, Keras, Hydra or Python lacks:
    one line, and exit code 8 (no retry cures it: the install must change)."""

    def __init__(self, distribution: str, internal: str, use: str):
        super().__init__(
            f"this {_NAMES[distribution]} ({installed_version(distribution)}) has no {internal}, which tfdistx "
            f"uses {use}: install {PINS[distribution]} (docs/development.md: Moving the pinned versions)",
            EXIT_UNSUPPORTED_VERSION,
        )


def installed_version(distribution: str) -> str:
    import importlib.metadata  # deferred, as platform: only when one is gone
    import platform

    if distribution == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class Internal:
    """`owner.attribute`, a private API of `distribution`, which tfdistx uses
    `use` (words that end "which tfdistx uses ..."). `owner` is a dotted path
    from the package (a module, a class); `instance`: an attribute only
    objects have once built (a Keras optimizer's lists), which the start-up
    probe cannot look for: it is checked on the object, where it is used."""

    distribution: str
    owner: str
    attribute: str
    use: str
    instance: bool = False

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.attribute}"

    def check(self, owner: Any = None) -> None:
        """Gone unless `owner` (default: the object `self.owner` names) has the attribute."""
        if not hasattr(self._owner() if owner is None else owner, self.attribute):
            raise Gone(self.distribution, self.name, self.use)

    def of(self, owner: Any) -> Any:
        """`owner`'s attribute; Gone when it has none."""
        self.check(owner)
        return getattr(owner, self.attribute)

    def get(self) -> Any:
        """The attribute of the object `self.owner` names; Gone when either is missing."""
        return self.of(self._owner())

    def _owner(self) -> Any:
        found: Optional[Any] = None
        parts = self.owner.split(".")
        for depth, part in enumerate(parts):
            path = ".".join(parts[: depth + 1])
            try:  # a module's attribute, else a submodule not yet imported
                found = (
                    getattr(found, part)
                    if found is not None and hasattr(found, part)
                    else importlib.import_module(path)
                )
            except ImportError:
                raise Gone(self.distribution, self.owner, self.use) from None
        return found


def probe(internals) -> None:
    """Each of `internals` that the start-up can look for is there (Gone: the first that is not)."""
    for internal in internals:
        if not internal.instance:
            internal.check()
