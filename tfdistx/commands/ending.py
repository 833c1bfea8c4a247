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


# A task of a Slurm step started by `tfdistx job slurm`'s script leaves its exit code in this directory, a
# file per rank (SLURM_PROCID): when one task fails, srun stops the others (--kill-on-bad-exit), which then
# checkpoint and exit 42 as on a preemption, and srun reports the largest code of all. The script reads which
# task failed first, and with what: that is the job's code (launch/slurm/script.py).
EXIT_CODES_ENV = "TFDISTX_EXIT_CODES"


def leave_exit_code(code: int) -> None:
    where, rank = os.environ.get(EXIT_CODES_ENV), os.environ.get("SLURM_PROCID", "")
    if not where or not rank.isdigit():
        return
    written = os.path.join(where, f".{rank}.{os.getpid()}")  # whole, then in place: the script reads no half
    try:
        with open(written, "w") as out:
            out.write(f"{code}\n")
        os.replace(written, os.path.join(where, rank))
    except OSError:  # the script then has srun's code, as without this
        pass


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
    leave_exit_code(code)
    internals.run_exit_functions()  # the one way to run them before os._exit
    logging.shutdown()  # flushes and closes tfdistx.log
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)
