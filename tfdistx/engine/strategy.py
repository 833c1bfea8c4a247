"""Turn a strategy name and a cluster into a tf.distribute.Strategy.

Like TF Model Garden's distribute_utils: one function, one name in, one
strategy out. What each name means (processes, options, replicas) is in the
TensorFlow-free table tfdistx/core/strategies.py; only the builders are here.
`configure_devices` must run before TensorFlow initialises its devices, which
is why the entrypoint calls it first.
"""

import itertools
import os
from typing import Mapping, Optional

import tensorflow as tf

from tfdistx import sigterm
from tfdistx.core import strategies
from tfdistx.core.errors import ConfigError
from tfdistx.internals import tensorflow as internals


def configure_devices(devices_per_worker: Optional[int], multi_worker: bool = False) -> None:
    """Without GPUs, split the CPU into `devices_per_worker` logical devices,
    so `strategy=mirrored cluster=1x4` has 4 real replicas on a laptop.

    Not for multi-worker strategies: MultiWorkerMirroredStrategy uses one
    replica per worker on CPUs whatever the logical devices (TF 2.21).
    """
    if multi_worker or tf.config.list_physical_devices("GPU"):
        return
    wanted = devices_per_worker or 1
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if wanted > 1 or tf.config.get_logical_device_configuration(cpu):
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    except RuntimeError:  # TensorFlow already started in this process
        have = len(tf.config.list_logical_devices("CPU"))
        if have < wanted:
            raise ConfigError.for_key(
                "cluster.devices_per_worker",
                devices_per_worker,
                f"TensorFlow already runs in this process with {have} CPU device(s) (an earlier job of a sweep); "
                "sweeping over device counts needs a process per job: add hydra/launcher=joblib",
            ) from None


def local_devices(devices_per_worker: Optional[int]) -> list:
    """The devices one worker's replicas run on: GPUs if any, else CPUs."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus:
        if devices_per_worker and devices_per_worker > len(gpus):
            raise ConfigError.for_key(
                "cluster.devices_per_worker", devices_per_worker, f"only {len(gpus)} GPU(s) are visible on this machine"
            )
        return gpus[: devices_per_worker or len(gpus)]
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    return cpus[: devices_per_worker or 1]


def concrete_name(name: str, workers: int, devices_per_worker: Optional[int]) -> str:
    """`auto` made concrete here: the table decides, given the devices found."""
    if name != strategies.AUTO or workers > 1:
        return strategies.resolve(name, workers, devices_per_worker)
    return strategies.resolve(name, workers, len(local_devices(devices_per_worker)))


def build(
    name: str, options: Mapping, devices_per_worker: Optional[int] = None, peer_timeout: Optional[float] = None
) -> tf.distribute.Strategy:
    """A concrete strategy name (see `concrete_name`) and its options -> the strategy.

    Multi-process strategies read TF_CONFIG, which the launcher, the
    scheduler or tfdistx's Slurm support has set. `peer_timeout`: seconds
    a synchronous cluster waits on a peer that stopped answering (None:
    TensorFlow's default).
    """
    strategy = _BUILDERS[name](options, devices_per_worker, peer_timeout=peer_timeout)
    sigterm.reclaim()  # the coordination service may have taken it
    return strategy


def _one_device(options, devices_per_worker, **_):
    if options.get("device"):
        return tf.distribute.OneDeviceStrategy(options["device"])
    # TF's default strategy is one replica on the default device (the
    # first GPU, else the CPU) without OneDeviceStrategy's per-step
    # wrapping of inputs, which costs a small model's step time.
    return tf.distribute.get_strategy()


_mirrored_built = itertools.count()


def _mirrored(options, devices_per_worker, **_):
    # TF numbers a MirroredStrategy's collective groups from 1, and its runtime
    # remembers each group's size for the life of the process. A second one of
    # another size in the same process (the next job of a sweep, or of the
    # unit tests) then fails: "joining a group with size 2, but that group has
    # size 4". A fresh key range per strategy built keeps them apart; TF's own
    # tests set the same class attribute for the same reason. The first
    # strategy of a process keeps TF's numbering.
    internals.number_mirrored_collectives_from(1000 * next(_mirrored_built))
    return tf.distribute.MirroredStrategy(
        local_devices(devices_per_worker), cross_device_ops=_cross_device_ops(options.get("cross_device_ops"))
    )


def _central_storage(options, devices_per_worker, **_):
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=local_devices(devices_per_worker), parameter_device="/cpu:0"
    )


def _multiworker(options, devices_per_worker, peer_timeout: Optional[float] = None):
    # Without GPUs, one replica per worker. Listing devices here
    # would start TensorFlow's context too early for the collectives.
    if peer_timeout:
        _coordination_service(peer_timeout)
    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
        "mpi": tf.distribute.experimental.CommunicationImplementation.RING,  # all but the gradients (engine/mpi.py)
    }[options.get("communication") or "auto"]
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    )


def _coordination_service(peer_timeout: float) -> None:
    """The coordination service MultiWorkerMirroredStrategy would start, with
    the heartbeat timeout set: a peer that has not sent a heartbeat for
    `peer_timeout` seconds is declared lost and every collective aborts.
    TensorFlow's own default is 10 s, which a peer paused for a moment (a
    long garbage collection, a busy host) exceeds; the strategy configures
    the service only when nothing has, so this must come first."""
    cluster_spec = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    jobs = {job: cluster_spec.num_tasks(job) for job in ("chief", "worker") if job in cluster_spec.jobs}
    internals.configure_coordination_service(cluster_spec, jobs, heartbeat_timeout_ms=int(peer_timeout * 1000))


def all_reduce_options(name: str, options: Mapping) -> Optional[tf.distribute.experimental.CommunicationOptions]:
    """Options for the gradients' all-reduce in a replica context. The
    strategy's own communication options do not reach it: TF packs a
    replica-context all-reduce by the options of the call alone
    (CollectiveAllReduce._all_reduce), so `bytes_per_pack` must come here."""
    if name != "multiworker" or not options.get("bytes_per_pack"):
        return None
    return tf.distribute.experimental.CommunicationOptions(bytes_per_pack=int(options["bytes_per_pack"]))


def all_reduce_dtype(name: str, options: Mapping) -> Optional[tf.DType]:
    """The dtype the gradients are summed in (`strategy.all_reduce_dtype`),
    None for the variables' own: float32, or a strategy without the option
    (the table lists which take it; validation refused it elsewhere). None
    rather than tf.float32, so that the float32 step has no cast at all and
    stays the step it was."""
    dtype = options.get("all_reduce_dtype") if "all_reduce_dtype" in strategies.STRATEGIES[name].options else None
    if dtype in (None, "float32"):
        return None
    return tf.as_dtype(dtype)


def _parameter_server(options, devices_per_worker, **_):
    # Variables go round-robin to the ps tasks; with strategy.partitioner,
    # TF's MinSizePartitioner first splits each large one into shards (a
    # ShardedVariable), which engine/sharding.py makes Keras 3 train and save.
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    settings = strategies.partitioner_settings(options.get("partitioner"), ps)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(**settings) if settings else None
    return tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


def _tpu(options, devices_per_worker, **_) -> tf.distribute.Strategy:
    # Without a name, an address or a TPU VM's accelerator devices there is
    # nothing to connect to; asking the resolver anyway would query cloud
    # metadata servers over the network.
    tpu = options.get("tpu") or os.environ.get("TPU_NAME")
    if not tpu and not os.path.exists("/dev/accel0") and not os.path.exists("/dev/vfio/0"):
        raise ConfigError.for_key(
            "strategy.tpu",
            tpu,
            "no TPU is reachable: set strategy.tpu (a TPU name or grpc:// address) or $TPU_NAME, or run on a TPU VM",
        )
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as error:
        raise ConfigError.for_key(
            "strategy.tpu", tpu, f"could not reach the TPU: {str(error).splitlines()[0]}"
        ) from None
    return tf.distribute.TPUStrategy(resolver)


# One builder per row of tfdistx/core/strategies.py.
_BUILDERS = {
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "tpu": _tpu,
    "multiworker": _multiworker,
    "parameter_server": _parameter_server,
}
assert set(_BUILDERS) == set(strategies.STRATEGIES), "a strategy row without a builder"


def _cross_device_ops(kind: Optional[str]):
    return {
        None: None,
        "auto": None,  # TF picks: NCCL on GPUs, a reduction to one device otherwise
        "nccl": tf.distribute.NcclAllReduce(),
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce(),
        "reduction_to_one": tf.distribute.ReductionToOneDevice(),
    }[kind]
