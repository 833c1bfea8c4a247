"""TensorFlow imported without its start-up banner.

`import tensorflow` writes "All log messages before absl::InitializeLog()"
and oneDNN / CPU-feature notes straight to file descriptor 2 from C++, before
any Python logging or TF_CPP_MIN_LOG_LEVEL applies (measured with TF 2.21:
the level hides none of them). They bury a run's one-line errors and print
once per task. So the import's stderr is caught in a file and passed on with
those known lines left out; anything else it printed (a real warning, an
import error's own text) still reaches the terminal. With
TF_CPP_MIN_LOG_LEVEL=0 (the user asked for TensorFlow's chatter) nothing is
filtered. No Hydra here.

The `tensorflow` wheel (with CUDA kernels, the one tfdistx installs) also
says on a machine without NVIDIA GPUs "Could not find cuda drivers" at import
and an E-level "failed call to cuInit" the first time it lists GPUs (measured
with TF 2.21, whatever TF_CPP_MIN_LOG_LEVEL). The GPUs are listed here, inside
the catch, and both lines are dropped there; on a machine with NVIDIA GPUs
they are kept: they say why TensorFlow cannot use them.
"""

import os
import re
import sys
import tempfile

from tfdistx import machine

_BANNER = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on|cpu_feature_guard"
    r"|To enable the following instructions|rebuild TensorFlow with the appropriate compiler flags"
)
_NO_GPU_HERE = re.compile(r"Could not find cuda drivers on your machine|failed call to cuInit")


_devices_listed = False  # in this process: a task forked from the prefork has not (cluster/prefork.py)


def import_tensorflow() -> None:
    """TensorFlow and Keras imported, and the internals of them that tfdistx
    uses looked for (tfdistx/internals: one line and exit 8 when one is gone)."""
    _import_quietly(list_devices=True)
    from tfdistx.internals import tensorflow as internals  # deferred: it imports TensorFlow

    internals.probe()


def import_before_fork() -> None:
    """TensorFlow and Keras imported without their banner, and nothing
    started: the local cluster's prefork (cluster/prefork.py) forks its
    tasks after this, and CUDA, TensorFlow's runtime and its threads must
    start in each task, not before the fork. The tasks list the GPUs."""
    _import_quietly(list_devices=False)


def _import_quietly(list_devices: bool) -> None:
    global _devices_listed
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0" or (
        "tensorflow" in sys.modules and (_devices_listed or not list_devices)
    ):
        import tensorflow  # noqa: F401

        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            import keras  # noqa: F401  (imported here so its own start-up lines are caught too)
            import tensorflow

            if list_devices:
                tensorflow.config.list_physical_devices(
                    "GPU"
                )  # CUDA's first look, caught here; the runtime is not started yet
                _devices_listed = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            no_gpu_here = machine.nvidia_gpus() == 0
            for line in caught.read().decode(errors="replace").splitlines():
                if line.strip() and not _BANNER.search(line) and not (no_gpu_here and _NO_GPU_HERE.search(line)):
                    print(line, file=sys.stderr)
