"""How the process of a command ends: without Python's teardown.

Only the standard library (and the room of its internals) here: the
entrypoint (cli.py) imports it first.
"""

import atexit
import logging
import os
import sys
from typing import NoReturn

from tfdistx.internals import python as internals


def hold_until_exit(anything) -> None:
    """Keep `anything` from being destroyed before the process ends: held
    by the process's exit functions, which end_process runs last of all."""
    atexit.register(lambda: anything)


def end_process(code) -> NoReturn:
    """End the process with `code` (SystemExit's: None is 0, a message is
    printed and 1) without Python's teardown. That teardown destroys the
    input pipelines still referenced (by a run's runner, or by the
    traceback of a preemption's exit) and can wait minutes on tf.data's
    thread pools, after a preemption's checkpoint or a mirrored run alike,
    long enough for a scheduler to SIGKILL a task that had saved. What must
    still happen does: atexit functions run (TensorFlow removes its
    autograph temp files), and the logs are flushed and closed."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    internals.run_exit_functions()  # the one way to run them before os._exit
    logging.shutdown()  # flushes and closes tfdistx.log
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)
