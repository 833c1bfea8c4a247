"""docs/config.md: every key of every config group, from the yaml files themselves.

Generated, not hand-copied, so it cannot drift: each option's file gives its
keys, their defaults and the comment beside them (and the comment above the
file's first key describes the option). tests/test_config.py checks the
committed file against this and every composed key against the file.

    python -m tfdistx.config.reference > docs/config.md
"""

import re
from pathlib import Path
from typing import List, Tuple

from tfdistx.config.paths import config_dir

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
_SKIPPED_GROUPS = ("hydra", "recipe")  # Hydra's own; recipes are listed by `tfdistx recipes`


def render(root: Path = None) -> str:
    root = Path(root or config_dir())
    out = ["# Configuration reference", "",
           "Generated from `conf/` by `python -m tfdistx.config.reference` (do not edit: a test compares).",
           "Pick an option with `GROUP=OPTION`; set a key with `GROUP.KEY=VALUE`. `cluster` also takes",
           "`WxD` and `psPwW` topology names, which set `workers`, `devices_per_worker` and `ps` and keep the",
           "other cluster keys' defaults below. Recipes: `tfdistx recipes`.", ""]
    for group in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in _SKIPPED_GROUPS):
        out += [f"## {group.name}", ""]
        options = [(option, *_option(group.name, option)) for option in sorted(group.glob("*.yaml"))]
        # A key means the same in every option of its group: said once, shown everywhere.
        meaning = {}
        for _, _, rows in options:
            for key, _, comment in rows:
                meaning.setdefault(key, comment) if comment else None
        for option, about, rows in options:
            out += [f"### {group.name}={option.stem}", ""] + ([about, ""] if about else [])
            if rows:
                out += ["| key | default | meaning |", "|---|---|---|"]
                out += [f"| `{key}` | `{value}` | {(comment or meaning.get(key, '')).replace('|', '/')} |" for key, value, comment in rows]
                out.append("")
    return "\n".join(out).rstrip() + "\n"


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
    for line in lines[len(header):]:
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
