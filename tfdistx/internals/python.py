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
_RUN_EXIT_FUNCTIONS = Internal("python", "atexit", "_run_exitfuncs", "to end a process without waiting on its input pipelines")


def run_exit_functions() -> None:
    _RUN_EXIT_FUNCTIONS.get()()


PROBES = (_RUN_EXIT_FUNCTIONS,)


def probe() -> None:
    internals.probe(PROBES)

