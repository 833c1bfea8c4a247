"""docs/config.md: every key of every config group, from the yaml files themselves.

Generated, not hand-copied, so it cannot drift: each option's file gives its
keys, their defaults and the comment beside them (and the comment above the
file's first key describes the option); the strategy group's options are
the rows of core/strategies.py, which say the same of themselves.
tests/test_config.py checks the committed file against this and every
composed key against the file.

    python -m tfdistx.config.reference > docs/config.md
"""

import re
from pathlib import Path
from typing import Any, Iterator, List, Mapping, Tuple

from tfdistx.core import strategies
from tfdistx.core.paths import config_dir

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
_SKIPPED_GROUPS = ("hydra", "recipe")  # Hydra's own; recipes are listed by `tfdistx recipes`


def render(root: Path = None) -> str:
    root = Path(root or config_dir())
    out = [
        "# Configuration reference",
        "",
        "Generated from `conf/` and the strategy table (`tfdistx/core/strategies.py`) by",
        "`python -m tfdistx.config.reference` (do not edit: a test compares).",
        "Pick an option with `GROUP=OPTION`; set a key with `GROUP.KEY=VALUE`. `cluster` also takes",
        "`WxD` and `psPwW` topology names, which set `workers`, `devices_per_worker` and `ps` and keep the",
        "other cluster keys' defaults below. Recipes: `tfdistx recipes`.",
        "",
    ]
    groups = {
        p.name: [(option.stem, *_option(p.name, option)) for option in sorted(p.glob("*.yaml"))]
        for p in root.iterdir()
        if p.is_dir() and p.name not in _SKIPPED_GROUPS
    }
    groups["strategy"] = _strategy_options()
    for group, options in sorted(groups.items()):
        out += [f"## {group}", ""]
        # A key means the same in every option of its group: said once, shown everywhere.
        meaning = {}
        for _, _, rows in options:
            for key, _, comment in rows:
                meaning.setdefault(key, comment) if comment else None
        for option, about, rows in options:
            out += [f"### {group}={option}", ""] + ([about, ""] if about else [])
            if rows:
                out += ["| key | default | meaning |", "|---|---|---|"]
                out += [
                    f"| `{key}` | `{value}` | {(comment or meaning.get(key, '')).replace('|', '/')} |"
                    for key, value, comment in rows
                ]
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def _strategy_options() -> List[Tuple[str, str, List[Tuple[str, str, str]]]]:
    """The strategy group's options, from the table's rows: (name, description, rows)."""
    found = [(strategies.AUTO, strategies.AUTO_DESCRIPTION, {})]
    found += [(name, row.description, row.options) for name, row in strategies.STRATEGIES.items()]
    return [
        (
            name,
            f"{about[0].upper()}{about[1:]}.",
            [("strategy.name", name, strategies.NAME_MEANING), *_option_rows("strategy", options)],
        )
        for name, about, options in sorted(found)
    ]


def _option_rows(prefix: str, options: Mapping[str, strategies.Option]) -> Iterator[Tuple[str, str, str]]:
    """(dotted key, default, meaning) of each option, a mapping's own keys after it."""
    for key, option in options.items():
        allowed = " / ".join(option.allowed) + ": " if option.allowed else ""
        yield f"{prefix}.{key}", _shown(option.value), allowed + option.meaning
        yield from _option_rows(f"{prefix}.{key}", option.keys)


def _shown(value: Any) -> str:
    """A default as YAML writes it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(inner)}" for key, inner in value.items()) + "}"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _option(group: str, path: Path) -> Tuple[str, List[Tuple[str, str, str]]]:
    """The option's description, and its (dotted key, default, comment) rows."""
    lines = path.read_text().splitlines()
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line)
    about = " ".join(line.lstrip("#").strip() for line in header if not line.startswith("# @"))
    rows, parents, in_defaults = [], [], False
    for line in lines[len(header) :]:
        match = _KEY.match(line)
        if not match:
            continue
        depth = len(match["indent"]) // 2
        key, value, comment = match["key"], match["value"].strip(), (match["comment"] or "").strip()
        parents = parents[:depth]
        if depth == 0:
            in_defaults = key == "defaults"
        if in_defaults:
            continue
        if not value:  # a mapping: its keys follow, indented
            parents.append(key)
            continue
        rows.append((f"{group}.{'.'.join([*parents, key])}", value, comment))
    return about, rows


if __name__ == "__main__":
    print(render(), end="")
