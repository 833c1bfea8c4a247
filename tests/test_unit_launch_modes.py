"""The ways a run's processes start (`cluster.launch`) are spelled in one
place, core/launch_mode.py's LaunchMode, and each has one room,
tfdistx/launch/<mode>: read from the source (AST), so that a new launch
(docs/development.md: "Adding a launch") cannot grow a list of its own
beside the enum, and nothing compares cluster.launch to a word of its own.
"""

import ast
from pathlib import Path

import pytest

import tfdistx
from tfdistx import cli
from tfdistx import launch as launches
from tfdistx.config.schema import ClusterConfig
from tfdistx.core.launch_mode import LaunchMode

pytestmark = pytest.mark.unit

PACKAGE = Path(tfdistx.__file__).parent
THE_ONE_PLACE = PACKAGE / "core" / "launch_mode.py"
WORDS = {mode.value for mode in LaunchMode}
THE_PHRASE = "placed by a scheduler"  # how a refusal of a local-only key in a scheduler's task says it


def _modules():
    return [path for path in sorted(PACKAGE.rglob("*.py")) if path != THE_ONE_PLACE]


def _words_in(node: ast.AST) -> set:
    """The launch mode words a literal list, tuple, set, dict or enum body spells."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [*node.keys, *node.values]
    elif isinstance(node, ast.ClassDef):
        items = [stmt.value for stmt in node.body if isinstance(stmt, ast.Assign)]
        items = [item.elts[0] if isinstance(item, ast.Tuple) and item.elts else item for item in items]
    else:
        return set()
    return {item.value for item in items if isinstance(item, ast.Constant) and item.value in WORDS}


def _is_launch(node: ast.AST) -> bool:
    """`x.launch`, `launch` or a LAUNCH constant: what holds a run's cluster.launch."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name.lower() == "launch"


def _spellings(path: Path) -> list:
    """Where a module spells the launch modes again: a list of two or more of them (an enum, a tuple, a map), a
    comparison of a launch with a word, a constant that names one, or a scheduler's refusal in its own words."""
    found, where = [], path.relative_to(PACKAGE) if PACKAGE in path.parents else path.name
    for node in ast.walk(ast.parse(path.read_text())):
        words = _words_in(node)
        if len(words) >= 2:  # one word alone may mean another thing ("auto" XLA's, "local" a TPU's)
            found.append(f"{where}:{node.lineno}: lists {sorted(words)}")
        if isinstance(node, ast.Compare) and any(map(_is_launch, [node.left, *node.comparators])):
            for side in [node.left, *node.comparators]:
                if _words_in(side) or isinstance(side, ast.Constant) and side.value in WORDS:
                    found.append(f"{where}:{node.lineno}: compares a launch with a word")
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value in WORDS
            and any(isinstance(t, ast.Name) and "LAUNCH" in t.id for t in node.targets)
        ):
            found.append(f"{where}:{node.lineno}: names a launch {node.value.value!r}")
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and THE_PHRASE in node.value:
            found.append(f"{where}:{node.lineno}: refuses a scheduler's task in words of its own")
    return found


def test_the_launch_modes_are_spelled_in_one_place():
    assert [found for path in _modules() for found in _spellings(path)] == []


def test_the_check_finds_a_second_spelling(tmp_path):
    """What the check above would find: the lists this tree once had (a tuple of the modes, the local ones, an enum
    of who placed a process, a comparison with a word, a constant, a refusal in a feature's own words)."""
    spelled = tmp_path / "spelled.py"
    spelled.write_text(
        'LAUNCH_MODES = ("auto", "local", "tf_config", "jobset", "slurm", "agent")\n'
        'LOCAL_LAUNCHES = ("local", "auto")\n'
        "class Source(str, Enum):\n"
        '    SINGLE = "single"\n    LOCAL = "local"\n    SLURM = "slurm"\n'
        'ok = cluster.launch == "agent"\n'
        'LAUNCH = "tf_config"\n'
        'why = "a local cluster\'s priority, and this task was placed by a scheduler"\n'
    )
    assert sorted(line.split(": ", 1)[1] for line in _spellings(spelled)) == [
        "compares a launch with a word",
        "lists ['agent', 'auto', 'jobset', 'local', 'slurm', 'tf_config']",
        "lists ['auto', 'local']",
        "lists ['local', 'slurm']",
        "names a launch 'tf_config'",
        "refuses a scheduler's task in words of its own",
    ]


def test_every_launch_has_its_room_and_the_config_and_the_command_line_read_them():
    """tfdistx/launch/<mode> holds each mode's LAUNCH; the config's default is a member; `tfdistx job KIND`'s kinds
    are the launches' own."""
    assert [launch.mode for launch in launches.every()] == [mode for mode in LaunchMode if mode is not LaunchMode.AUTO]
    assert LaunchMode(ClusterConfig.launch) is LaunchMode.AUTO
    kinds = launches.jobs()
    assert set(kinds) == {"slurm", "tfjob", "jobset", "trainjob"}
    assert {word.split()[1]: module for word, module in cli.SUBCOMMANDS.items() if word.startswith("job ")} == {
        kind: job.command for kind, job in kinds.items()
    }
    assert launches.chosen_by_auto({}) is LaunchMode.LOCAL  # no scheduler's environment: tfdistx starts them


def test_the_old_spelling_still_writes_the_job_and_says_the_new_one_in_one_line(capsys):
    """`tfdistx export slurm` (the name before `tfdistx job`) prints the same script for one more release, with one
    line on stderr naming the new command; a SavedModel's `tfdistx export RUN_DIR` keeps its name."""
    argv = ["slurm", "strategy=multiworker", "cluster=2x1"]
    with pytest.raises(SystemExit) as new:
        cli.main(["job", *argv])
    now = capsys.readouterr()
    with pytest.raises(SystemExit) as old:
        cli.main(["export", *argv])
    before = capsys.readouterr()
    assert (new.value.code, old.value.code) == (0, 0) and now.out.startswith("#!/bin/bash\n")
    assert before.out == now.out
    note = "tfdistx: `tfdistx export slurm` is now `tfdistx job slurm`; the old name goes in the next release\n"
    assert before.err == note + now.err
    assert cli.SUBCOMMANDS["export"] == "tfdistx.commands.export"
