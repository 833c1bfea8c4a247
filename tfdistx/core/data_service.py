"""`data.service`: the input pipeline on a tf.data service, as facts that
need no TensorFlow (validate.py, placement, the launcher and the TFJob read
them; data/service.py builds the pipeline, engine/data_service.py runs the
servers).

`data.service.workers=N` adds two jobs to the run's cluster: one
`dispatcher` and N `dataworker` tasks. They are placed like the other tasks
(a local launch, TF_CONFIG, a Slurm step; a TFJob's `Dispatcher` and
`DataWorker` replicas) but are taken out of the cluster spec TensorFlow's
strategies see (cluster/data_service.py).
"""

from typing import Dict, Optional

from tfdistx.core.errors import Problem

DISPATCHER, WORKER = "dispatcher", "dataworker"  # TF_CONFIG job names (a TFJob's replica types, lowercased)
JOBS = (DISPATCHER, WORKER)
PARALLEL_EPOCHS, DISTRIBUTED_EPOCH = "parallel_epochs", "distributed_epoch"
MODES = (PARALLEL_EPOCHS, DISTRIBUTED_EPOCH)
DEFAULT_MODE = DISTRIBUTED_EPOCH  # the mode in which every example is trained at most once per epoch
KEYS = ("workers", "mode")
MOST_WORKERS = 64


def settings(data) -> Optional[dict]:
    """{"workers": N, "mode": M} of an enabled service (the default mode
    filled in), or None: the input pipeline runs in the trainers."""
    service = data.get("service") if hasattr(data, "get") else None
    workers = service.get("workers") if hasattr(service, "get") else None
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        return None
    return {"workers": workers, "mode": service.get("mode") or DEFAULT_MODE}


def workers(data) -> int:
    on = settings(data)
    return on["workers"] if on else 0


def job_counts(data) -> Dict[str, int]:
    """The service's tasks per job, in rank order after the training jobs ({} when off)."""
    return jobs(workers(data))


def jobs(workers: int) -> Dict[str, int]:
    """The tasks of a service of `workers` data workers ({} when 0: off)."""
    return {DISPATCHER: 1, WORKER: workers} if workers else {}


def problems(data) -> list:
    service = data.get("service")
    if service is None:
        return []
    if not hasattr(service, "keys"):
        return [Problem("data.service", service, "a group of keys: data.service.workers=N (0: off), data.service.mode")]
    found = [
        Problem(f"data.service.{key}", service[key], f"data.service has no such key; its keys: {', '.join(KEYS)}")
        for key in service.keys()
        if key not in KEYS
    ]
    n = service.get("workers", 0)
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MOST_WORKERS:
        found.append(
            Problem(
                "data.service.workers",
                n,
                f"tf.data service workers: a whole number from 0 (off: the input "
                f"pipeline runs in the trainers) to {MOST_WORKERS}",
            )
        )
    mode = service.get("mode")
    if mode is not None and mode not in MODES:
        found.append(Problem("data.service.mode", mode, f"allowed: {', '.join(MODES)} (null: {DEFAULT_MODE})"))
    elif mode is not None and n == 0:  # a key that would do nothing
        found.append(
            Problem(
                "data.service.mode",
                mode,
                "applies to a tf.data service, and data.service.workers=0 runs the input "
                "pipeline in the trainers: set data.service.workers=N, or leave data.service.mode out",
            )
        )
    return found


def resume_warning(data, deterministic: bool) -> Optional[str]:
    """One line for a run that asks for reproducibility the service cannot give."""
    on = settings(data)
    return mode_resume_warning(on["mode"] if on else None, deterministic)


def mode_resume_warning(mode: Optional[str], deterministic: bool) -> Optional[str]:
    """resume_warning of a service in `mode` (None: no service)."""
    if mode is None or not deterministic:
        return None
    if mode == PARALLEL_EPOCHS:
        return (
            "trainer.deterministic=true with data.service.mode=parallel_epochs: each tf.data service worker shuffles "
            "in an order of its own, so neither a run nor its resume is reproducible (docs/multi-process.md: "
            "data.service)"
        )
    return (
        "trainer.deterministic=true with data.service: which batch a step trains depends on which tf.data service "
        "worker answers first, and batches in flight when a run stops are lost, so a resumed run is not bitwise equal "
        "to an uninterrupted one (docs/multi-process.md: data.service)"
    )
