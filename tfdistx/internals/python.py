"""The standard library's private APIs, each behind a named function (see
tfdistx/internals/__init__.py). No TensorFlow, no Hydra.

Checked on CPython 3.11.7.
"""

from tfdistx import internals
from tfdistx.internals import Internal

# Runs the functions registered with atexit, now. A process that ends with
# os._exit (cli.end_process: without Python's teardown, which can wait
# minutes on tf.data's threads) must still run them, and only this runs
# them before the interpreter's own exit.
_RUN_EXIT_FUNCTIONS = Internal(
    "python", "atexit", "_run_exitfuncs", "to end a process without waiting on its input pipelines"
)


# The functions registered with threading._register_atexit, which Python's
# own shutdown calls before atexit's: the pools of worker processes and
# threads (concurrent.futures; joblib's loky, which Hydra's joblib launcher
# uses) stop their workers there. Skipped, multiprocessing's atexit function
# then waits on loky's idle workers until they time out (300 s: a joblib
# sweep that had finished sat there five minutes).
_THREADING_EXIT_FUNCTIONS = Internal(
    "python",
    "threading",
    "_threading_atexits",
    "to stop the worker pools (a joblib sweep's processes) before a process ends with os._exit",
)


def run_exit_functions() -> None:
    """What Python's shutdown runs, in its order: threading's exit
    functions (last registered first), then atexit's."""
    for stop in reversed(list(_THREADING_EXIT_FUNCTIONS.get())):
        stop()
    _RUN_EXIT_FUNCTIONS.get()()


PROBES = (_RUN_EXIT_FUNCTIONS, _THREADING_EXIT_FUNCTIONS)


def probe() -> None:
    internals.probe(PROBES)
