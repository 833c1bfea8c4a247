"""What every command shares: composing the config (with tfdistx's own
config names registered) and refusing bad input in one line.

Errors pass one guard, `one_line_errors`, once TensorFlow may have started:
a bad config (ConfigError) or a fault of the machine (RunFault) is refused
in its own lines and exit code; anything else is a bug or a fault no check
foresaw, and is one line with exit 1. TFDISTX_TRACEBACK=1 shows the
traceback behind any of them, for a bug report.
"""

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Callable, Optional, Sequence, Tuple

from hydra.errors import HydraException
from omegaconf import DictConfig

from tfdistx import launch as launches
from tfdistx.config import recipes, schema, topology, userconf
from tfdistx.config.compose import as_config_error, compose_and_validate
from tfdistx.config.resolve import layout_of
from tfdistx.core.overrides import given_value
from tfdistx.core.run_spec import Layout
from tfdistx.core.errors import EXIT_INVALID_CONFIG, ConfigError, RunFault, interrupted
from tfdistx.internals import hydra as hydra_internals
from tfdistx.log_files import into_log_files  # no TensorFlow there
from tfdistx.sigterm import CTRL_C


def register_config_names(overrides) -> None:
    """What composing needs known first, in one place: the schema's types,
    then the names of the groups' options beyond the shipped files. The
    first to parse the overrides, so an override Hydra cannot parse
    (`trainer.steps=$(id)`, an unbalanced quote) is refused here, for
    every command (ConfigError: one line, exit 2)."""
    schema.register()  # the structured config: types checked at compose time
    hydra_internals.probe()  # before Hydra composes: the internals of it that tfdistx uses are there
    try:
        userconf.register(overrides)  # --config-dir / TFDISTX_CONFIG_PATH: the user's own groups and experiments
        topology.register(overrides)  # cluster=WxD / psPwW names
        recipes.register(overrides)  # TFDISTX_RECIPES dirs, and the clusters the chosen recipes name
    except HydraException as error:  # an override Hydra cannot parse (`trainer.steps='3`): its words, in one line
        raise as_config_error(error, overrides) from None


def compose(overrides: Sequence[str], notes: bool = True) -> DictConfig:
    """The composed and validated config for these overrides, as every
    command sees it (raises ConfigError)."""
    register_config_names(overrides)
    return compose_and_validate(overrides, notes=notes)


def compose_as_placed(
    overrides: Sequence[str], launch_of: Callable[[Layout], Optional[str]], default_launch: str
) -> Tuple[DictConfig, Layout]:
    """The config as the tasks of a scheduler's job (`tfdistx job slurm|tfjob|jobset|trainjob`) will compose and
    check it: `overrides` with the cluster.launch they are given (`launch_of(layout)`: None, the one composed), then
    what a task a scheduler placed refuses at its start (launch.refused_in_a_placed_task). So a job refuses, in the
    tasks' own line, what every task would refuse at its start. A config that does not compose as given (an elastic
    one without hosts, which a local run needs) is refused in the tasks' words when they refuse it too (composed with
    `default_launch`, theirs unless the command line names one), else in its own."""
    try:
        cfg = compose(overrides, notes=False)
    except ConfigError as as_given:
        if given_value("cluster.launch", overrides) is not None:
            raise
        compose([*overrides, f"cluster.launch={default_launch}"], notes=False)  # raises the tasks' own refusal
        raise as_given from None
    layout = layout_of(cfg)
    launch = launch_of(layout)
    placed = [*overrides, f"cluster.launch={launch}"] if launch not in (None, layout.cluster.launch) else overrides
    cfg = compose(placed)  # as the tasks compose it (and its notes, said once)
    layout = layout_of(cfg)
    if layout.cluster.agent is None:  # the agents start their workers themselves, as the local launcher does
        refused = launches.refused_in_a_placed_task(layout)
        if refused:
            raise ConfigError(refused)
    return cfg, layout


@contextlib.contextmanager
def one_line_errors():
    """The one guard every error passes (see the module's docstring). Once
    Ctrl-C has reached the process, whatever error follows is Ctrl-C's: it
    leaves as KeyboardInterrupt, for the caller's quiet exit 130. (It comes
    out of TensorFlow's C++ in disguise: CPython's SystemError "returned a
    result with an exception set", pybind11's "MISMATCH ... REPLACED BY
    KeyboardInterrupt", or a peer's UnavailableError as the peer stops too.)"""
    with _noting_ctrl_c() as ctrl_c:
        try:
            yield
        except Exception as error:
            if ctrl_c.is_set() or interrupted(error):
                raise KeyboardInterrupt from None
            _refuse_in_one_line(error)


@contextlib.contextmanager
def _noting_ctrl_c():
    """Python's Ctrl-C (KeyboardInterrupt) as it was, and a note that it came."""
    seen = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield seen  # signal.signal works only in the main thread; an ignored SIGINT stays ignored
        return

    def note_then_interrupt(signum, frame):
        seen.set()
        CTRL_C.set()  # the process's too: what a destructor then complains of is not printed (sigterm.py)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note_then_interrupt)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _refuse_in_one_line(error: Exception) -> None:
    if isinstance(error, (ConfigError, RunFault)):
        refuse(error)
    if wants_traceback():
        raise error
    text = str(error).strip()
    first = text.splitlines()[0][:400] if text else ""
    line = (
        f"tfdistx: error: {type(error).__name__}{': ' + first if first else ''} "
        "(TFDISTX_TRACEBACK=1 shows the traceback)"
    )
    print(line, file=sys.stderr)
    into_log_files(line, logging.ERROR)
    _nothing_more_from_tensorflow()
    sys.exit(1)


def log_lines_as_a_run_shows_them(level: int = logging.INFO) -> None:
    """tfdistx's log lines (and their warnings) on the terminal as a run
    shows them, the message alone (a run's console: conf/config.yaml's
    hydra.job_logging, which a command without Hydra's run does not get),
    on stderr: a command's stdout is its answer (evaluate's JSON). Set
    before TensorFlow starts: a library that configures the root logger
    later (Python's default `WARNING:name:message`) then finds it done."""
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")


def start_tensorflow() -> None:
    """TensorFlow imported (without its start-up banner) once a command has
    checked its arguments: a refusal never waits for it (seconds, ~0.7 GB)."""
    from tfdistx.engine.quiet_import import import_tensorflow  # deferred: only once the work starts

    import_tensorflow()


def wants_traceback() -> bool:
    return os.environ.get("TFDISTX_TRACEBACK", "") not in ("", "0")


def refuse(error):
    """One line per problem, no traceback; exit 2 for a bad config, the fault's own code otherwise."""
    if wants_traceback():
        import traceback

        traceback.print_exc()
    for line in error.lines():
        print(line, file=sys.stderr)
        into_log_files(line, logging.ERROR)
    _nothing_more_from_tensorflow()
    sys.exit(error.code if isinstance(error, RunFault) else EXIT_INVALID_CONFIG)


def _nothing_more_from_tensorflow() -> None:
    """After the one line, TensorFlow's own warnings are noise: a refused
    resume's restore, say, lists every value it did not restore when the
    process exits (its restore coordinator's deleter)."""
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
