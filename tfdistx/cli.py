"""The entrypoint: `python -m tfdistx [overrides]` and the `tfdistx` script.

One table of commands (tfdistx/commands/, a module each). Each is imported
only when asked for, so a training run pays nothing for the others, and
checks its arguments before it starts TensorFlow, if it needs it at all
(commands/common.start_tensorflow): a refusal never waits for it.
"""

import contextlib
import importlib
import os
import sys
from typing import Optional, Sequence

from tfdistx import launch as launches
from tfdistx.commands.ending import end_process

from tfdistx.core.errors import EXIT_INTERRUPTED, RunFault
from tfdistx.internals import python as internals
from tfdistx.sigterm import SigtermNotice, quiet_after_ctrl_c, release

TASK = "_task"
# `tfdistx NAME ...` runs a tool instead of a training job.
SUBCOMMANDS = {
    "recipes": "tfdistx.commands.recipes",  # list, show and copy out recipes
    "report": "tfdistx.commands.report",  # plots and a table for a run or sweep dir
    "export": "tfdistx.commands.export",  # a SavedModel from a run's checkpoint
    "job": "tfdistx.cli:job_kinds",  # the kinds below, listed
    # `job KIND`: a scheduler's script or manifests for the composed config, each its launch's (tfdistx/launch/),
    # as MODULE:FUNCTION (one module may hold several kinds, a function each)
    **{f"job {kind}": job.command for kind, job in launches.jobs().items()},
    "data write": "tfdistx.commands.data_write",  # any data source as sharded TFRecord/CSV files + a manifest
    "evaluate": "tfdistx.commands.evaluate",  # metrics of a run's checkpoint on the eval data
    "predict": "tfdistx.commands.predict",  # a run's export applied to files (or its eval data): sharded predictions
    TASK: "tfdistx.commands.task",  # one task of a local cluster (started by the launcher)
}
# `export KIND`, the earlier spelling of `job KIND`, still works for one release, with a line that says so.
RENAMED = {f"export {kind}": f"job {kind}" for kind in launches.jobs()}


def main(argv: Optional[Sequence[str]] = None):
    """`argv` None: the process's own command line (python -m tfdistx, the
    tfdistx script), and the process ends with the command (`end_process`);
    given a list (a notebook, a test), main returns."""
    if argv is not None:
        return _command(list(argv), process_ends_after=False)
    task = sys.argv[1:2] == [TASK]
    try:
        # A training run or a local cluster's task takes SIGTERM and Ctrl-C over first thing (sigterm.py); then
        # it takes what its launcher held for it while it started (nothing, for a command a user started).
        # What it does with a SIGTERM is said once it knows (a trainer's loop, a server, a launcher passing it on).
        notice = SigtermNotice(plan="", ctrl_c=True) if _trains(sys.argv[1:]) else contextlib.nullcontext()
        with notice, quiet_after_ctrl_c():
            release()
            try:
                internals.probe()  # before any command: end_process needs it
            except RunFault as gone:
                print(*gone.lines(), file=sys.stderr)
                sys.exit(gone.code)
            code = _command(sys.argv[1:], process_ends_after=True)
    except SystemExit as leaving:
        code = leaving.code
    except KeyboardInterrupt:  # Ctrl-C, wherever it came: one line (a task's launcher says it), no traceback
        if not task:
            print("tfdistx: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    end_process(code)


def _trains(argv: list) -> bool:
    """A training run (no subcommand: composing and a sweep too) or a local cluster's task: SIGTERM is a
    notice to save there, and Ctrl-C saves once training. Any other command ends on them, as Python would."""
    return argv[:1] == [TASK] or not any(" ".join(argv[:n]) in {**SUBCOMMANDS, **RENAMED} for n in (1, 2))


def _command(argv: list, process_ends_after: bool):
    # TensorFlow's C++ start-up chatter (CPU features, oneDNN) buries the
    # progress display; users can still ask for it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # `python -m tfdistx` imports a user's `_target_=digits.load` from the
    # current directory; the `tfdistx` script must too (its sys.path[0] is
    # the script's own directory).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    if " ".join(argv[:2]) in RENAMED:
        now = RENAMED[" ".join(argv[:2])]
        print(
            f"tfdistx: `tfdistx {' '.join(argv[:2])}` is now `tfdistx {now}`; the old name goes in the next release",
            file=sys.stderr,
        )
        argv = [*now.split(), *argv[2:]]
    words = next((n for n in (2, 1) if " ".join(argv[:n]) in SUBCOMMANDS), 0)  # `job tfjob` before `job`
    try:
        # `job KIND` takes --config-dir itself, to hand it on to the job's tasks (the pods, the nodes); any other
        # command's goes into TFDISTX_CONFIG_PATH here, for the command alone
        carries = words == 2 and argv[0] == "job"
        if any(arg.partition("=")[0] in ("--config-dir", "-cd") for arg in argv) and not carries:
            argv = _user_config_dirs(argv)
        if not words:
            from tfdistx.commands import run  # deferred like the others: `tfdistx recipes` needs none of it

            return run.main(argv, process_ends_after=process_ends_after)
        module, _, function = SUBCOMMANDS[" ".join(argv[:words])].partition(":")
        sys.exit(getattr(importlib.import_module(module), function or "main")(argv[words:]))
    except BrokenPipeError:  # `tfdistx recipes | head`, `--plan | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)


def _user_config_dirs(argv: list) -> list:
    """`--config-dir DIR` for every command (a run, `data write`, `recipes`,
    `job tfjob`): taken out of the command line and into
    TFDISTX_CONFIG_PATH, where every command's composition looks."""
    from tfdistx.commands.common import refuse  # deferred: only when the flag is given
    from tfdistx.config import userconf
    from tfdistx.core.errors import ConfigError

    try:
        return userconf.take_flags(argv)
    except ConfigError as error:
        refuse(error)


def job_kinds(argv: list) -> int:
    """`tfdistx job`: the kinds of `tfdistx job KIND`, one a line (a kind it does not know is refused so too)."""
    kinds = launches.jobs()
    asked = argv[0] if argv and not argv[0].startswith("-") else None
    lines = [f"  {kind:<10}{job.what}" for kind, job in kinds.items()]
    text = "usage: tfdistx job KIND [overrides] [options]: a scheduler's script or manifests for the run\n" + "\n".join(
        lines
    )
    if asked is not None:
        print(f"tfdistx job: {asked!r} is no kind of job; allowed: {', '.join(kinds)}\n{text}", file=sys.stderr)
        return 2
    print(text)
    return 0
