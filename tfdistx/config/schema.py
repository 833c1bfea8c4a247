"""Structured config: the types Hydra checks while it composes.

Groups whose keys vary by option or are passed to a user's `_target_`
(strategy, task, model, data, optimizer, logger, callbacks) stay free-form here and are checked
in `validate.py`; the rest get dataclasses, so `trainer.steps=abc` is refused
at compose time with the key named.
"""

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from tfdistx.core import strategies
from tfdistx.core.errors import DEFAULT_NOTICE_SIGNALS
from tfdistx.core.launch_mode import LaunchMode

# Keys of the data group that shape the input pipeline, not the source, with
# their defaults for a data option that does not set them: the run spec keeps
# them from the source's `_target_` (spec.py), and a user's `data._target_`
# is given them (compose.py).
# `service`: the tf.data service (core/data_service.py; None: off).
PIPELINE_DEFAULTS = {"batch_size": 128, "cache": False, "shuffle_buffer": 10_000, "service": None}
PIPELINE_KEYS = tuple(PIPELINE_DEFAULTS)

# Keys of the task group that are tfdistx's, not the task class's.
TASK_KEYS = ("name", "objective")
# What a task's YAML says of the task for the checks before TensorFlow starts
# (config/tasks.py): tfdistx's too, and not kept for a `task._target_` the
# command line names (they are the option's facts, not that target's).
TASK_FACTS = ("offers", "labels")

# The optimizer group is free-form (an optimizer class takes keys of its
# own); tfdistx's keys of it, with their defaults for an option that does not
# set them (conf/optimizer/*.yaml shows them; resolve.py fills them in). The
# logger group's built-in loggers and their defaults are their classes' (tfdistx/loggers/).
OPTIMIZER_DEFAULTS = {
    "schedule": "constant",
    "warmup_steps": 0,
    "min_lr_ratio": 0.0,
    "scale_lr_with_replicas": False,
    "clip_norm": None,
    "global_clip_norm": None,
}
OPTIMIZER_KEYS = ("name", "lr", *OPTIMIZER_DEFAULTS)


@dataclass
class EarlyStoppingConfig:
    patience: Optional[int] = None  # evaluations without an improvement before the run stops; None: never
    min_delta: float = 0.0  # an improvement must beat the best by more than this


@dataclass
class TrainerConfig:
    steps: Optional[int] = 1000
    epochs: Optional[int] = None
    steps_per_loop: int = 100
    log_every: int = 100
    eval_every: int = 500
    eval_steps: Optional[int] = None
    seed: int = 0
    deterministic: bool = False
    objective: str = "${task.objective}"  # a metric the task reports: loss, eval/loss, eval/<metric>, <metric>
    jit_compile: Any = "auto"  # true, false or auto (validate.py)
    steps_per_xla_call: Any = "auto"  # N consecutive steps in one XLA computation, or auto (core/compute.py)
    precision: str = "float32"
    accumulate_steps: int = 1
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    profile_steps: Any = None  # [START, END]: a profiler trace of those steps (validate.py); null: none


@dataclass
class CheckpointConfig:
    every_steps: int = 500
    max_to_keep: int = 3
    dir: Optional[str] = None
    restore: bool = True
    export: bool = True
    keep_best: bool = False  # also keep the checkpoint best by trainer.objective, in <dir>/best; the export is of it
    init_from: Optional[str] = None  # warm start: a run dir, a checkpoint prefix, a .weights.h5 or a .keras file
    init_skip: List[str] = field(default_factory=list)  # regexes of variable paths left freshly initialised
    background: bool = True  # periodic saves written while the steps go on (engine/checkpoint_writer.py)


@dataclass
class ElasticConfig:
    """Elastic training (core/elastic.py): as many workers as hosts are up, from min_workers to cluster.workers."""

    min_workers: Optional[int] = (
        None  # null: not elastic; else the fewest workers a round trains with (cluster.workers: the most)
    )
    # Any, not str: a YAML boolean or number (`discover=false`) is refused as one (core/elastic.py), not run as a
    # command named False
    hosts: Any = None  # a file listing the hosts workers may run on, one a line, read whenever it changes
    discover: Any = None  # or a command printing them, one a line (as Horovod's --host-discovery-script)
    join_grace: float = (
        10.0  # seconds a round forming with min_workers or more waits for the rest, up to cluster.workers
    )
    # seconds a lost worker's host has to be listed again before a round forms without it; also how long a change
    # of the list must hold
    lost_bound: float = 10.0
    below_min_timeout: float = 300.0  # seconds the run waits with fewer hosts than min_workers before it stops (exit 9)


@dataclass
class AgentConfig:
    """cluster.launch=agent: one agent per node, meeting at a rendezvous (core/agent.py)."""

    store: Any = None  # host:port of the rendezvous, kept by the agent on that host
    address: Any = (
        None  # this node's address, which its peers reach its worker at; null: the one it reaches the store from
    )
    token_file: Any = None  # the run's secret, which every beat to the store proves; null: RUN/logs/rendezvous.key


@dataclass
class ClusterConfig:
    name: str = "local"
    workers: int = 1
    devices_per_worker: Optional[int] = None
    ps: int = 0
    launch: str = LaunchMode.AUTO.value  # how its processes start (core/launch_mode.py: the list and what each means)
    isolate: Optional[bool] = None
    prefork: bool = True  # local clusters: tasks forked from one process that imported TensorFlow (cluster/prefork.py)
    base_port: int = 29400
    max_restarts: int = 3
    startup_timeout: float = 300.0
    stopped_task_timeout: float = 60.0
    peer_timeout: float = 60.0  # a task that stopped answering this long counts as lost (exit 5)
    # after SIGTERM: how long the tasks get to save (None: derived from the checkpoint's save, core/checkpoint_size.py)
    preemption_grace: Optional[float] = None
    # Signals that, like SIGTERM, mean checkpoint and exit 42 (core/errors.NOTICE_SIGNALS): USR1, Slurm's
    # time-limit notice
    notice_signals: List[str] = field(default_factory=lambda: list(DEFAULT_NOTICE_SIGNALS))
    retryable_exit_offset: int = 0  # added to exit codes 4, 5 and 42: 128 for Kubernetes' restartPolicy ExitCode
    evaluator: bool = (
        False  # a sidecar evaluator task beside the cluster (multi-process strategies; cluster/evaluator.py)
    )
    task_threads: Any = "auto"  # local clusters: TensorFlow threads per pool in each task (core/threads.py)
    nice: int = 0  # local clusters: above 0, the cluster's processes yield the cores to the machine's other work (0-19)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)


@dataclass
class Config:
    strategy: Any = field(default_factory=dict)
    task: Any = field(default_factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: Any = field(default_factory=dict)
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)  # NAME -> {_target_: a Keras callback or a tfdistx action, its keys}


def tasks_per_job(strategy: str, workers: int, ps: int, evaluator: bool = False, service_workers: int = 0) -> int:
    """Processes a run needs: for the Slurm launcher's tasks_per_node (a
    sidecar evaluator is one more task, the step's last; data.service adds
    a dispatcher and its workers)."""
    service = 1 + int(service_workers) if int(service_workers or 0) > 0 else 0
    return (
        max(sum(strategies.get(strategy, int(workers)).job_counts(int(workers), int(ps)).values()), 1)
        + bool(evaluator)
        + service
    )


def run_name(env=os.environ) -> str:
    """The default run directory's name, under outputs/.

    Every task of a multi-task Slurm step must write one run directory, and
    each stamping its own start time made one each: inside such a step the
    name comes from the job and step ids (a requeued job resumes there).
    Elsewhere, the start time to the microsecond (runs started together get
    their own)."""
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if "SLURM_PROCID" in env and env.get("SLURM_JOB_ID") and tasks.isdigit() and int(tasks) > 1:
        return f"slurm/{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return _STARTED.strftime("%Y-%m-%d/%H-%M-%S-%f")


_STARTED = datetime.datetime.now()


def register() -> None:
    store = ConfigStore.instance()
    store.store(name="tfdistx_schema", node=Config)
    for name, node in strategies.nodes().items():  # the strategy group's options are the table's rows, not files
        store.store(group="strategy", name=name, node=node)
    OmegaConf.register_new_resolver("tfdistx_tasks", tasks_per_job, replace=True)
    OmegaConf.register_new_resolver("tfdistx_run_name", run_name, replace=True, use_cache=True)
