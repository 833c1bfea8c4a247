"""The strategies tfdistx runs, as facts that need no TensorFlow.

One table: for each `strategy=` name, the processes it needs, the options it
takes (their defaults, meanings and allowed values), how many replicas it
plans and which topologies it can run on. Validation, cluster placement,
`--plan` and the CLI read it; each row is also the `strategy=NAME` option
Hydra composes (schema.register stores `nodes()`, no file in conf/), and
docs/config.md lists its keys (reference.py). `tfdistx/engine/strategy.py`
holds only the TensorFlow builder for each name.
Adding a strategy: a row here, a builder there.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tfdistx.core.errors import Problem

# How a strategy's processes are laid out.
ONE_PROCESS = "one process"
ONE_PER_WORKER = "one process per worker"  # synchronous: every worker trains every step
COORDINATOR = "a coordinator, parameter servers and workers"  # asynchronous steps scheduled on free workers


@dataclass(frozen=True)
class Option:
    """One strategy.KEY: what it means (docs/config.md says it), its default
    in the composed config, and the values validation allows (None: any)."""

    meaning: str
    default: Any = None
    allowed: Optional[Tuple[str, ...]] = None
    keys: Mapping[str, "Option"] = field(default_factory=dict)  # a mapping's own keys; its default is theirs

    @property
    def value(self) -> Any:
        """The option's default as the composed config holds it."""
        return {key: option.value for key, option in self.keys.items()} if self.keys else self.default


@dataclass(frozen=True)
class StrategyRow:
    name: str
    description: str
    processes: str
    options: Mapping[str, Option] = field(default_factory=dict)  # strategy.KEY -> its Option
    one_replica: bool = False  # one_device: never more than one replica
    not_in_tfjob: Optional[str] = None  # why `tfdistx job tfjob` cannot place it (None: it can)
    no_xla: Optional[str] = None  # why trainer.jit_compile cannot be on (None: it can)
    # XLA compiles the whole step (gradients, the sum over replicas, the optimizer's update) when the one
    # replica's variables are on the device that computes; otherwise the gradients only, and the sum and
    # the update run where the strategy's collectives and variable placement work (engine/update.py).
    xla_whole_step: bool = False
    precisions: Tuple[str, ...] = ("float32", "mixed_bfloat16", "mixed_float16")  # trainer.precision values it runs

    @property
    def node(self) -> Dict[str, Any]:
        """The `strategy=NAME` option as Hydra composes it: the name, then each option's default."""
        return {"name": self.name, **{key: option.value for key, option in self.options.items()}}

    @property
    def multi_process(self) -> bool:
        return self.processes != ONE_PROCESS

    @property
    def asynchronous(self) -> bool:
        """Steps are scheduled by a coordinator on whichever worker is free."""
        return self.processes == COORDINATOR

    def stale_gradients_warning(self, workers: int, steps: Optional[int]) -> Optional[str]:
        """Asynchronous workers apply gradients computed on weights others
        have since changed: in as many steps they learn much less than one
        device. Said by --plan and at the start of the run itself."""
        if not self.asynchronous or workers < 2 or steps is None or steps >= 1000 * workers:
            return None
        # How much less: docs/performance.md's table of the default job under parameter servers.
        return (
            f"{workers} asynchronous workers apply stale gradients: {steps} steps learn much less than on one device; "
            f"give it more steps (trainer.steps={1000 * workers}) — see docs/multi-process.md on asynchronous "
            "training"
        )

    def job_counts(self, workers: int, ps: int) -> Dict[str, int]:
        """Tasks per TF_CONFIG job name (in rank order: chief, ps, worker)."""
        if self.processes == COORDINATOR:
            return {"chief": 1, "ps": ps, "worker": workers}
        if self.processes == ONE_PER_WORKER:
            return {"worker": workers}
        return {}

    @property
    def primary_jobs(self) -> Tuple[str, ...]:
        """The jobs whose end is the run's end (the others only serve them)."""
        return ("chief",) if self.asynchronous else ("worker",)

    @property
    def serving_jobs(self) -> Tuple[str, ...]:
        """Jobs whose tasks run a TensorFlow server for the coordinator and train nothing themselves."""
        return ("ps", "worker") if self.asynchronous else ()

    @property
    def restartable_alone(self) -> Tuple[str, ...]:
        """Jobs whose lost task can be restarted on its own (the coordinator reschedules its steps)."""
        return ("worker",) if self.asynchronous else ()

    def planned_replicas(self, workers: int, devices: Optional[int]) -> Optional[int]:
        """Replicas a step runs on, when that is known without TensorFlow (None: the GPUs found decide)."""
        if self.one_replica or self.asynchronous:
            return 1  # parameter servers: each step is one worker's whole batch
        if self.processes == ONE_PER_WORKER:
            return workers  # one per worker without GPUs; at least that with them
        return devices

    def topology_problems(
        self, given: str, workers: int, devices: Optional[int], ps: int, cluster_name: str
    ) -> List[Problem]:
        """Why this strategy (asked for as `given`, maybe `auto`) cannot run on the cluster."""
        topology = f"cluster={cluster_name} ({workers} worker(s), {ps} ps)"
        problems = []
        if self.asynchronous and ps < 1:
            problems.append(
                Problem("strategy", given, f"needs parameter servers; {topology} has none: use e.g. cluster=ps1w2")
            )
        if not self.asynchronous and ps > 0:
            problems.append(
                Problem("strategy", given, f"{topology} has parameter servers: use strategy=parameter_server")
            )
        if not self.multi_process and workers > 1:
            problems.append(
                Problem(
                    "strategy",
                    given,
                    f"runs on one machine but {topology} has several workers: use strategy=multiworker",
                )
            )
        if self.one_replica and (devices or 1) > 1:
            problems.append(
                Problem(
                    "strategy",
                    given,
                    f"runs one replica but cluster={cluster_name} asks for {devices} devices: use strategy=mirrored",
                )
            )
        return problems


# What TF 2.21 answers: "Trying to access resource ... located in device ... Cf.
# https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device".
_VARIABLES_ELSEWHERE = (
    "its variables live {where}, away from the device that computes, and XLA compiles only steps whose variables are "
    "on their own device"
)
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduction_to_one")
# strategy.communication: how multiworker's collectives cross processes (engine/strategy.py; mpi: core/mpi.py).
COMMUNICATION_MEANS = {
    "auto": "ring over gRPC on CPUs, NCCL on GPUs",
    "ring": "ring over gRPC",
    "nccl": "NCCL",
    "mpi": "the gradients through MPI, each task under mpiexec; the rest ring over gRPC",
}
COMMUNICATIONS = tuple(COMMUNICATION_MEANS)
# The dtype tfdistx's one gradient all-reduce sums in (engine/update.py); the
# synchronous strategies whose replicas all-reduce take it. The 16-bit ones
# halve the bytes on the wire and round each gradient to 8 (bfloat16) or 11
# (float16) significant bits; docs/scaling.md has what that saves and costs.
ALL_REDUCE_DTYPES = ("float32", "bfloat16", "float16")

_ALL_REDUCE_DTYPE = (
    "the dtype the gradients are summed in across {who} (16 bits: half the bytes{where}, rounded gradients; "
    "docs/scaling.md)"
)
# strategy.partitioner (parameter_server): see partitioner_settings below.
_PARTITIONER = Option(
    "split each large variable (a Dense kernel, an Embedding table) into shards on several ps tasks with TensorFlow's "
    "own partitioners; off while both keys are null; strategy.partitioner=true: on, with 256 KiB and one shard per ps",
    keys={
        "min_shard_bytes": Option("a variable of more than this many bytes is split into ceil(bytes / this) shards"),
        "max_shards": Option("at most this many shards of one variable (null: cluster.ps, one per ps)"),
    },
)

STRATEGIES: Dict[str, StrategyRow] = {
    s.name: s
    for s in [
        StrategyRow(
            "one_device",
            "one replica on one device (TF's default strategy, or OneDeviceStrategy on strategy.device)",
            ONE_PROCESS,
            {
                "device": Option(
                    "e.g. /gpu:1 (OneDeviceStrategy); null: TF's default strategy on the first GPU, else the CPU"
                )
            },
            one_replica=True,
            xla_whole_step=True,
        ),
        StrategyRow(
            "mirrored",
            "MirroredStrategy: synchronous replicas on this machine's GPUs or logical CPU devices",
            ONE_PROCESS,
            {
                "cross_device_ops": Option(
                    "how the replicas' gradients are summed (auto: NCCL on GPUs, a reduction to one device otherwise)",
                    "auto",
                    CROSS_DEVICE_OPS,
                ),
                "all_reduce_dtype": Option(
                    _ALL_REDUCE_DTYPE.format(who="replicas", where=""), "float32", ALL_REDUCE_DTYPES
                ),
            },
        ),
        StrategyRow(
            "central_storage",
            "CentralStorageStrategy: variables on the CPU, compute replicated on this machine's devices",
            ONE_PROCESS,
            no_xla=_VARIABLES_ELSEWHERE.format(where="on the CPU"),
        ),
        StrategyRow(
            "tpu",
            "TPUStrategy through TPUClusterResolver",
            ONE_PROCESS,
            {"tpu": Option("TPU name or grpc:// address; default: $TPU_NAME, else a local TPU VM")},
            not_in_tfjob=(
                "a TPU is reached through its own resolver (strategy.tpu), not a TFJob's TF_CONFIG: run it on a TPU VM"
            ),
            precisions=("float32", "mixed_bfloat16"),
        ),
        StrategyRow(
            "multiworker",
            "MultiWorkerMirroredStrategy: synchronous all-reduce across worker processes",
            ONE_PER_WORKER,
            {
                "communication": Option(
                    "the collectives' implementation across workers (mpi: the gradients' sum through MPI, "
                    "on the local launcher; pip install 'tfdistx[mpi]')",
                    "auto",
                    COMMUNICATIONS,
                ),
                "bytes_per_pack": Option(
                    "gradients all-reduced in packs of this many bytes, so the first packs can go "
                    "while the backward pass goes on (0: one pack)",
                    0,
                ),
                "all_reduce_dtype": Option(
                    _ALL_REDUCE_DTYPE.format(who="workers", where=" on the network"), "float32", ALL_REDUCE_DTYPES
                ),
            },
        ),
        StrategyRow(
            "parameter_server",
            "ParameterServerStrategy + ClusterCoordinator: asynchronous steps on free workers, variables on ps tasks",
            COORDINATOR,
            {"partitioner": _PARTITIONER},
            no_xla=_VARIABLES_ELSEWHERE.format(where="on the ps tasks"),
        ),
    ]
}

AUTO = "auto"
AUTO_DESCRIPTION = "picks one_device, mirrored or multiworker from the cluster and the visible devices"
NAMES = (AUTO, *STRATEGIES)
NAME_MEANING = "the tf.distribute strategy (set by strategy=NAME)"


def nodes() -> Dict[str, Dict[str, Any]]:
    """Each `strategy=NAME` option as Hydra composes it (schema.register stores them)."""
    return {AUTO: {"name": AUTO}, **{name: row.node for name, row in STRATEGIES.items()}}


# strategy.partitioner (parameter_server): TF's MinSizePartitioner splits a
# variable of more than min_shard_bytes by rows into ceil(bytes /
# min_shard_bytes) shards, at most max_shards (and rows); the shards go
# round-robin to the ps tasks like whole variables. 256 KiB is TF's default.
PARTITIONER_KEYS = ("min_shard_bytes", "max_shards")
DEFAULT_MIN_SHARD_BYTES = 256 << 10
_PARTITIONER_ALLOWED = (
    "true (256 KiB shards, one per ps), false/null (off), or {min_shard_bytes: BYTES >= 1, "
    "max_shards: N >= 1} (either may be null: 256 KiB; cluster.ps)"
)


def partitioner_settings(value, ps: int) -> Optional[Dict[str, int]]:
    """strategy.partitioner made concrete: {'min_shard_bytes', 'max_shards'},
    or None when it is off (false, null, or a mapping whose keys are all null)."""
    if value is None or value is False:
        return None
    given = {} if value is True else {k: value.get(k) for k in PARTITIONER_KEYS}
    if value is not True and all(v is None for v in given.values()):
        return None
    return {
        "min_shard_bytes": int(given.get("min_shard_bytes") or DEFAULT_MIN_SHARD_BYTES),
        "max_shards": int(given.get("max_shards") or max(ps, 1)),
    }


def partitioner_problems(value) -> List[Problem]:
    """A bad strategy.partitioner, in one line per problem (the value is a
    bool, null or a mapping: `value` may be an OmegaConf node or a dict)."""
    if value is None or isinstance(value, bool):
        return []
    if not hasattr(value, "keys"):
        return [Problem("strategy.partitioner", value, _PARTITIONER_ALLOWED)]
    problems = [
        Problem(f"strategy.partitioner.{key}", value[key], f"strategy.partitioner takes {', '.join(PARTITIONER_KEYS)}")
        for key in value.keys()
        if key not in PARTITIONER_KEYS
    ]
    for key in PARTITIONER_KEYS:
        number = value.get(key)
        if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 1):
            what = "bytes" if key == "min_shard_bytes" else "shards"
            problems.append(
                Problem(
                    f"strategy.partitioner.{key}",
                    number,
                    f"a whole number of {what}, at least 1 (or null: "
                    f"{'256 KiB' if key == 'min_shard_bytes' else 'cluster.ps'})",
                )
            )
    return problems


def shards_of(shape: Sequence[int], settings: Optional[Mapping[str, int]], bytes_per_value: int = 4) -> int:
    """How many shards TF's MinSizePartitioner cuts a variable into
    (partitioned_variables.min_max_variable_partitioner, TF 2.21)."""
    if not settings or not shape:
        return 1
    size = math.prod(shape) * bytes_per_value
    return max(1, min(shape[0], settings["max_shards"], math.ceil(size / settings["min_shard_bytes"])))


def ps_bytes(shapes: Sequence[Sequence[int]], ps: int, settings: Optional[Mapping[str, int]]) -> List[int]:
    """Bytes of float32 variables of these shapes (in creation order) on each
    ps task, placed as ParameterServerStrategy places them: each variable,
    or each of its shards (rows split as evenly as TF splits them), on the
    next ps in turn."""
    held, turn = [0] * max(ps, 1), 0
    for shape in shapes:
        n = shards_of(shape, settings)
        rows, rest = divmod(shape[0], n) if shape else (1, 0)
        for i in range(n):
            part_rows = (rows + (i < rest)) if shape else 1
            held[turn % len(held)] += part_rows * math.prod(shape[1:]) * 4
            turn += 1
    return held


def taking(key: str) -> Tuple[str, ...]:
    """The strategies that take strategy.KEY (for a refusal elsewhere)."""
    return tuple(name for name, row in STRATEGIES.items() if key in row.options)


def resolve(name: str, workers: int, local_devices: Optional[int]) -> str:
    """`auto` made concrete: multiworker for several workers, else mirrored
    over several local devices, else one_device. `local_devices`: devices
    per worker as configured or found (None: not known yet, counts as one)."""
    if name != AUTO:
        return name
    if workers > 1:
        return "multiworker"
    return "mirrored" if (local_devices or 1) > 1 else "one_device"


def get(name: str, workers: int = 1, local_devices: Optional[int] = None) -> StrategyRow:
    """The table row for a (possibly `auto`) strategy name."""
    return STRATEGIES[resolve(name, workers, local_devices)]


def describe_jobs(counts: Mapping[str, int]) -> str:
    """{'chief': 1, 'ps': 1, 'worker': 2} -> '1 chief, 1 ps, 2 workers' (for messages)."""
    return ", ".join(f"{n} {job}{'s' if n != 1 and job != 'ps' else ''}" for job, n in counts.items() if n)
