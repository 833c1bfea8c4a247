"""The run spec: what a run is, as plain typed data the engine reads.

Everything here is frozen dataclasses of plain values; this module imports
nothing of Hydra, OmegaConf or TensorFlow, so the engine (and a notebook or
a test) can hold a RunSpec without the config side. The config side makes
one from a composed config (config/resolve.py), where every default is
filled in once. The user's own code (model, data source, task) is a
Target: its `_target_` and keys, built when the engine asks (targets.py).
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple, Union

from tfdistx.core import data_service, strategies
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.targets import Target


@dataclass(frozen=True)
class EarlyStopping:
    patience: Optional[int]  # evaluations (of a train objective: logged steps) without an improvement; None: off
    min_delta: float


@dataclass(frozen=True)
class Trainer:
    steps: Optional[int]
    epochs: Optional[int]
    steps_per_loop: int
    log_every: int
    eval_every: int  # 0: at the end only
    eval_steps: Optional[int]  # None: the whole eval split
    seed: int
    deterministic: bool
    objective: str
    jit_compile: Union[bool, str]  # True, False or "auto" (core/compute.py decides)
    precision: str
    accumulate_steps: int
    early_stopping: EarlyStopping
    profile_steps: Optional[Tuple[int, int]]  # (START, END): the profiler traces the steps between; None: no trace
    steps_per_xla_call: Union[int, str]  # N or "auto" (core/compute.py decides)


@dataclass(frozen=True)
class Checkpoint:
    dir: str  # resolved: checkpoint.dir, or <run dir>/checkpoints
    every_steps: int
    background: bool  # the periodic saves written while the steps go on (else the steps wait for each)
    max_to_keep: int
    restore: bool
    export: bool
    keep_best: bool
    init_from: Optional["InitFrom"]  # None: no warm start
    init_skip: Tuple[str, ...]


@dataclass(frozen=True)
class InitFrom:
    """A warm start's source (core/warm_start.py)."""

    path: str  # as given (summary.json says it)
    kind: Optional[str]  # warm_start.RUN, CHECKPOINT, KERAS or WEIGHTS; None: not looked at (the run resumes)
    # The source run's own resolved spec, when the path is a run or a checkpoint inside one: its model is
    # rebuilt as that run built it. None: a bare checkpoint or a Keras file, read with this run's spec.
    spec: Optional["RunSpec"] = None


@dataclass(frozen=True)
class Bounds:
    """A run in rounds' bounds, whoever forms its rounds (the local launcher's elastic rounds, or the agents'
    rendezvous): MIN to MAX workers, the wait past MIN for more, how long a lost member has to come back, and how
    long the run waits below MIN. cluster.elastic's keys (core/elastic.py); a fixed run's agents have MIN = MAX."""

    min: int
    max: int
    join_grace: float
    lost_bound: float
    below_min_timeout: float


@dataclass(frozen=True)
class Elastic:
    """cluster.elastic of an elastic run (core/elastic.py): rounds of min_workers to cluster.workers, a worker per
    host listed; its bounds are the cluster's `rounds`."""

    min_workers: int
    hosts: Optional[str]  # a file listing the hosts, one a line; or
    discover: Optional[str]  # a command printing them


@dataclass(frozen=True)
class Agent:
    """cluster.agent of a run whose nodes each run an agent (cluster.launch=agent, core/agent.py)."""

    store: str  # host:port of the rendezvous
    address: Optional[str]  # this node's address; None: the one it reaches the store from
    token_file: Optional[str]  # the run's secret (launch/agent/run_secret.py); None: made in the run directory
    # The rendezvous' bounds are the cluster's `rounds` (a fixed run's agents wait for a lost node as an elastic
    # run's do)


@dataclass(frozen=True)
class Cluster:
    name: str
    workers: int  # an elastic run's most workers
    ps: int
    devices_per_worker: Optional[int]
    startup_timeout: float
    peer_timeout: float  # seconds before a task that stopped answering counts as lost
    preemption_grace: float  # seconds from SIGTERM to SIGKILL
    notice_signals: Tuple[
        str, ...
    ]  # besides SIGTERM, the signals that mean checkpoint and exit 42 (sigterm.py): USR1 ...
    retryable_exit_offset: int  # added to the exit codes a restart cures (core/errors.py)
    # How the processes are placed and kept (placement, the local launcher, --plan, the Kubernetes manifests):
    launch: LaunchMode  # who starts the processes and how each learns its place (tfdistx/launch/)
    isolate: Optional[bool]  # a local cluster in a private network namespace; None: when the OS allows it
    prefork: bool  # a local cluster's tasks forked from one process that imported TensorFlow once
    base_port: int  # Slurm: the first task's port on each node
    max_restarts: int
    stopped_task_timeout: float
    evaluator: bool  # a sidecar evaluator task beside the cluster
    task_threads: Union[
        int, str
    ]  # a local cluster's TensorFlow threads per pool in each task, or "auto" (core/threads.py)
    nice: int  # a local cluster's priority: 0 as any program, up to 19 (cluster/processes.yield_the_cores)
    elastic: Optional[Elastic]  # None: a fixed cluster
    agent: Optional[Agent]  # None: not cluster.launch=agent
    rounds: Optional[Bounds] = None  # a run in rounds' bounds (elastic, or agents'); None: a fixed set of tasks


@dataclass(frozen=True)
class Strategy:
    name: str  # as configured ("auto" is made concrete by the engine, which sees the devices)
    options: Mapping[str, Any]  # the strategy group's other keys
    row: strategies.StrategyRow  # the configured strategy's row


@dataclass(frozen=True)
class DataService:
    """data.service when it is on (core/data_service.py)."""

    workers: int
    mode: str  # core/data_service.MODES


@dataclass(frozen=True)
class Pipeline:
    """The input pipeline's keys of the data group (the rest go to the source)."""

    batch_size: int  # the global batch of one micro-step
    cache: bool
    shuffle_buffer: int
    service: Optional[DataService]  # None: the pipeline runs in the trainers


@dataclass(frozen=True)
class Optimizer:
    """The optimizer group: tfdistx's keys (engine/optim.py reads them), and
    the rest for the optimizer class itself."""

    name: str  # as the plan and logs show it: the shortcut, or the class's dotted path
    target: str  # the class's dotted path (core/optimizers.py: a shortcut's, or optimizer._target_)
    lr: float  # peak learning rate, before scaling with replicas
    schedule: Union[str, Target]  # constant | cosine | warmup_cosine, or a LearningRateSchedule's _target_ and keys
    warmup_steps: int
    min_lr_ratio: float
    scale_lr_with_replicas: bool
    clip_norm: Optional[float]
    global_clip_norm: Optional[float]
    options: Mapping[str, Any]  # the class's own keys: beta_1, momentum, ...


@dataclass(frozen=True)
class Logger:
    """The logger group: the built-in loggers a run has (tfdistx/loggers/'s
    classes, each a Target of its class and keys, in built_in()'s order), and the
    user's own. metrics.jsonl is every chief's, and not here."""

    on: Mapping[str, Target]  # logger.NAME of a built-in logger that is on -> its class and keys
    own: Mapping[str, Target] = field(
        default_factory=dict
    )  # logger.NAME: {_target_: ...}: the user's loggers (engine/loggers.py)


@dataclass(frozen=True)
class Layout:
    """Where a run's processes go and how they are kept: the strategy's
    row, the cluster, and the tf.data service's tasks. Placement, the local
    launcher, --plan and the Kubernetes manifests read this, not the config."""

    strategy: Strategy
    cluster: Cluster
    service: Optional[DataService]  # None: no tf.data service

    def service_jobs(self) -> Mapping[str, int]:
        """The tf.data service's tasks per job ({} when it is off)."""
        return data_service.jobs(self.service.workers if self.service else 0)

    def training_jobs(self) -> Mapping[str, int]:
        """The strategy's tasks per job; a one-process strategy's one trainer is a `worker`."""
        return self.strategy.row.job_counts(self.cluster.workers, self.cluster.ps) or {"worker": 1}

    def servers_beside_the_keeper(self) -> Mapping[str, int]:
        """With an agent on every node (launch/agent/node.py), the tasks the keeper's
        node runs beside its worker, per job: a parameter-server run's chief
        and ps tasks, the tf.data service's dispatcher and data workers."""
        return {**{job: n for job, n in self.training_jobs().items() if job != "worker"}, **self.service_jobs()}

    def jobs_on_an_agents_node(self, keeper: bool) -> Mapping[str, int]:
        """With an agent on every node, the tasks one node runs, per job (what its TensorFlow threads are sized
        for): its worker, and on the keeper's node the servers beside it."""
        return {"worker": 1, **(self.servers_beside_the_keeper() if keeper else {})}


@dataclass(frozen=True)
class RunSpec:
    run_dir: Path
    trainer: Trainer
    checkpoint: Checkpoint
    cluster: Cluster
    strategy: Strategy
    pipeline: Pipeline
    task: Target
    data: Target
    model: Target
    optimizer: Optimizer
    logger: Logger
    config: Mapping[str, Any]  # the whole resolved config as plain data, as the loggers record it
    callbacks: Mapping[str, Target] = field(
        default_factory=dict
    )  # NAME -> the user's callback (engine/callbacks.py), in order

    @property
    def layout(self) -> Layout:
        return Layout(self.strategy, self.cluster, self.pipeline.service)
