"""The run's log file (Hydra's file handler) as the terminal shows it: a
line printed on the terminal goes into it too, and a disk that cannot take
more is one warning line, not a traceback per line. No TensorFlow and no
Hydra here: the commands use it before TensorFlow starts.
"""

import logging
import sys
from typing import List

from tfdistx.rundir import cannot_write


def into_log_files(line: str, level: int = logging.INFO, name: str = "tfdistx") -> None:
    """A line printed on the terminal goes into the run's log file as well
    (a single run's tfdistx.log, which Hydra's file handler writes), so that
    the file holds the run as the terminal showed it: step lines, warnings,
    refusals. Not through `log.info`: the console handler would print it a
    second time. A local cluster's tasks have no file handler: the launcher
    files their output. Imports no TensorFlow (commands use it too)."""
    for handler in log_files():
        handler.emit(logging.LogRecord(name, level, __file__, 0, line, None, None))


def log_files() -> List[logging.FileHandler]:
    """The run's log files (Hydra's file handler), each of which, once its
    disk cannot take more (full, a file-size limit), says so in one line
    instead of Python's `--- Logging error ---` and a traceback per line."""
    handlers = [handler for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)]
    for handler in handlers:
        if not isinstance(handler.handleError, _SaidOnceWhenUnwritable):
            handler.handleError = _SaidOnceWhenUnwritable(handler)
    return handlers


class _SaidOnceWhenUnwritable:
    """A log file handler's handleError: an unwritable disk is one warning
    line (the run's own writes stop it with its line and exit code, or it
    goes on with its lines on the terminal only); any other error is Python's."""

    def __init__(self, handler: logging.Handler):
        self.handler, self.said = handler, False

    def __call__(self, record: logging.LogRecord) -> None:
        cause = cannot_write(sys.exc_info()[1])
        if cause is None:
            logging.Handler.handleError(self.handler, record)
        elif not self.said:
            self.said = True
            print(
                f"tfdistx: warning: {getattr(self.handler, 'baseFilename', 'the log file')} cannot be written "
                f"({cause}): the run's lines go on to the terminal only",
                file=sys.stderr,
                flush=True,
            )
