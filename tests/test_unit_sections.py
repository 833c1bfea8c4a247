"""Each component is handed its section, as torchtitan hands
`job_config.checkpoint` to its checkpointer: the whole RunSpec (or the
`Run` the build phase makes) goes only where a phase begins, and the
composed config (a DictConfig) is read only on the config side. Held by
reading the package's source (AST), so a new function that takes the whole
to read one field of it, or a new read of the composed config outside
config/, fails here with its file, line and name."""

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

import tfdistx

pytestmark = pytest.mark.unit

PACKAGE = Path(tfdistx.__file__).parent
WHOLE = {"RunSpec", "Run"}  # the whole spec, and the bag of parts the build phase makes from it
MOST_FIELDS = 2  # a function reading this many of the whole's fields or fewer is handed those instead

# Where a phase begins: these take the whole RunSpec (the Run: the runner and the train loop), whatever they read.
PHASE_ENTRIES = {
    ("engine/fit.py", "train"),
    ("engine/fit.py", "evaluate"),
    ("engine/fit.py", "train_loop"),
    ("engine/build.py", "build_run"),
    ("engine/runner.py", "make_runner"),
    ("engine/sidecar.py", "run"),
    ("engine/parts.py", "model_from_checkpoint"),  # rebuilding a saved run's model (export, warm start)
}

# Functions of the launch side that the launch branch moves into tfdistx/launch/ (the LaunchSpec, the manifests'
# options record): not changed here, to leave that branch's files whole. The lead empties these lists when it merges.
LAUNCH_SIDE_WHOLE: Set[Tuple[str, str]] = set()
LAUNCH_SIDE_CONFIG_READS: Set[Tuple[str, str]] = {
    ("spec/agent.py", "problems"),  # cluster.launch=agent's checks, before the config is resolved
    ("spec/elastic.py", "problems"),  # cluster.workers=MIN:MAX's checks, likewise
    ("spec/elastic.py", "_batch_on_every_round"),
    ("commands/task.py", "main"),  # a local cluster's task: handed a YAML of the config to resolve again
    ("commands/slurm.py", "main"),  # `export slurm` composes its config to place the job
    ("commands/kubernetes.py", "_code_the_image_must_have"),  # the manifests' command: the targets the image needs
}

# The side that composes and reads the config, and the command that composes the run's (Hydra's app, which reads
# Hydra's own keys: hydra.run.dir, hydra.callbacks, hydra.sweep.dir).
CONFIG_SIDE = ("config/", "commands/run.py")
# What yields a composed config (or a run's saved one), and what reads one by a key.
COMPOSERS = {"compose", "compose_and_validate", "compose_as_placed", "saved_config", "composed"}
KEY_READERS = {"select", "to_container", "plain_value"}


def functions() -> Iterator[Tuple[str, ast.FunctionDef]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield where, node


def parameters(function: ast.FunctionDef) -> List[ast.arg]:
    arguments = function.args
    return [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]


def names_in(annotation) -> Set[str]:
    """The names an annotation spells (`Optional[RunSpec]`, `"Run"`, `run_spec.RunSpec`)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return names_in(ast.parse(annotation.value, mode="eval").body)
    found = set()
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= names_in(node)
    return found


def fields_read(function: ast.FunctionDef, name: str) -> Tuple[Set[str], bool]:
    """The fields of parameter `name` the function reads (`spec.trainer.steps`: trainer), and whether it uses
    the parameter whole (hands it on, stores or returns it: what it is handed is what it needs)."""
    read, as_values = set(), set()
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
            read.add(node.attr)
            as_values.add(id(node.value))
    whole = any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load) and id(node) not in as_values
        for node in ast.walk(function)
    )
    return read, whole


def whole_for_a_few_fields() -> Dict[Tuple[str, str], List[str]]:
    """Functions that take the whole RunSpec or Run and read at most MOST_FIELDS of its fields, never using it whole."""
    found = {}
    for where, function in functions():
        for parameter in parameters(function):
            if not names_in(parameter.annotation) & WHOLE or (where, function.name) in PHASE_ENTRIES:
                continue
            read, whole = fields_read(function, parameter.arg)
            if not whole and len(read) <= MOST_FIELDS:
                found[(where, function.name)] = sorted(read)
    return found


def config_reads() -> Dict[Tuple[str, str], List[int]]:
    """Lines outside the config side that read the composed config: a key of a parameter named `cfg` or typed
    DictConfig, or of what a composer returned (`cfg.data`, `cfg["data"]`, `OmegaConf.select(cfg, ...)`)."""
    found: Dict[Tuple[str, str], List[int]] = {}
    for where, function in functions():
        if where.startswith(CONFIG_SIDE):
            continue
        configs = {
            p.arg for p in parameters(function) if p.arg == "cfg" or "DictConfig" in names_in(p.annotation)
        } | _composed_names(function)
        lines = set()
        for node in ast.walk(function):
            if isinstance(node, (ast.Attribute, ast.Subscript)) and _is_config(node.value, configs):
                lines.add(node.lineno)
            elif isinstance(node, ast.Call) and _called(node) in KEY_READERS and node.args:
                if _is_config(node.args[0], configs):
                    lines.add(node.lineno)
        if lines:
            found[(where, function.name)] = sorted(lines)
    return found


def _composed_names(function: ast.FunctionDef) -> Set[str]:
    """Names bound to a composed config in `function`: `cfg = compose(...)`, `cfg, layout = compose_as_placed(...)`,
    `with composed(...) as cfg`, `cfg = OmegaConf.load(...)`."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and _is_composer(node.value):
            for target in node.targets:
                first = target.elts[0] if isinstance(target, ast.Tuple) else target
                if isinstance(first, ast.Name):
                    names.add(first.id)
        elif isinstance(node, ast.With):
            for item in node.items:
                if _is_composer(item.context_expr) and isinstance(item.optional_vars, ast.Name):
                    names.add(item.optional_vars.id)
    return names


def _is_composer(node) -> bool:
    if not isinstance(node, ast.Call):
        return False
    function = node.func
    loads = (
        isinstance(function, ast.Attribute) and function.attr == "load" and ast.unparse(function.value) == "OmegaConf"
    )
    return loads or _called(node) in COMPOSERS


def _is_config(node, configs: Set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in configs) or _is_composer(node)


def _called(call: ast.Call):
    function = call.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)


def test_the_whole_spec_goes_only_where_a_phase_begins():
    found = {key: read for key, read in whole_for_a_few_fields().items() if key not in LAUNCH_SIDE_WHOLE}
    assert found == {}, (
        "these take the whole RunSpec or Run and read at most two of its fields: hand them those fields (or their "
        f"section) instead: {found}"
    )


def test_the_composed_config_is_read_only_on_the_config_side():
    found = {key: lines for key, lines in config_reads().items() if key not in LAUNCH_SIDE_CONFIG_READS}
    assert found == {}, (
        "these read the composed config outside config/ and the command that composes it: read the RunSpec, or "
        f"a function of config/: {found}"
    )


def test_the_allow_lists_name_only_what_is_still_there():
    """An entry the launch branch has made good is taken off (the lists shrink to empty, never go stale)."""
    assert LAUNCH_SIDE_WHOLE <= set(whole_for_a_few_fields())
    assert LAUNCH_SIDE_CONFIG_READS <= set(config_reads())


def test_the_counts_see_what_they_look_for():
    """The scans find a function that takes the whole for one field, and a read of the config, when there is one."""
    source = ast.parse(
        "def steps(spec: RunSpec):\n    return spec.trainer.steps\n"
        "def phase(spec: 'RunSpec'):\n    return build(spec)\n"
        "def label(cfg):\n    return cfg.data.label\n"
    )
    function, phase, label = source.body
    assert fields_read(function, "spec") == ({"trainer"}, False) and fields_read(phase, "spec") == (set(), True)
    assert names_in(phase.args.args[0].annotation) == {"RunSpec"}
    assert _is_config(label.body[0].value.value.value, {"cfg"})
