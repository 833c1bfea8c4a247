"""`--plan`: what a run would do, printed without starting TensorFlow."""

from typing import Any, Mapping

from omegaconf import DictConfig

from tfdistx import launch as launches
from tfdistx import machine
from tfdistx.config import sources
from tfdistx import loggers as builtin_loggers
from tfdistx.core import agent, checkpoint_size, compute, elastic, strategies
from tfdistx.config.compose import hydra_run_dir
from tfdistx.config.resolve import resolve
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout, Logger, Optimizer
from tfdistx.core.targets import Target

RUN_DIR = "<run dir>"  # where the plan shows the run's own paths (its checkpoints, say)


def describe(cfg: DictConfig) -> str:
    """--plan's lines for a composed config, read from its run spec (as the
    run will read it; the run dir shown as `<run dir>`)."""
    spec = resolve(cfg, RUN_DIR)
    layout = spec.layout
    strategy, topo, row, trainer = layout.strategy.name, layout.cluster, layout.strategy.row, spec.trainer
    placement = launches.detect(layout)
    chosen = f"  -> {row.name}" if strategy == strategies.AUTO else ""
    if strategy == strategies.AUTO and placement.launch is None:
        chosen += " (mirrored instead when several GPUs are visible)"
    lines = [f"strategy      {strategy}{chosen}: {row.description}"]
    lines.append(
        f"cluster       {topo.name}: {topo.workers} worker(s) x "
        f"{topo.devices_per_worker or 'all GPUs or 1 CPU'} device(s), {topo.ps} ps"
    )
    if topo.agent is not None:
        lines.append(agent.plan_line(topo, layout.servers_beside_the_keeper()))
    elif elastic_line := elastic.plan_line(topo):
        lines.append(elastic_line)
    lines.append(f"devices       {machine.describe()}")  # this machine's: each of a scheduler's hosts has its own
    if machine.conflict():
        lines.append(f"WARNING       {machine.conflict()}")
    lines += _tasks(layout, placement)
    task = spec.config["task"]
    lines.append(
        f"task          {task.get('name', task['_target_'])}: "
        f"metrics {', '.join(task.get('metrics') or [_unsaid(task)])}; "
        f"objective {trainer.objective}"
    )

    replicas = row.planned_replicas(topo.workers, topo.devices_per_worker)
    batch = spec.pipeline.batch_size
    if row.asynchronous:
        lines.append(
            f"replicas      {topo.workers} workers, asynchronous: each step trains one worker on a whole batch"
        )
        lines.append(f"batch         {batch} per step")
        lines.append(
            f"data          each worker reads its own 1/{topo.workers} of the examples (sharded by worker index); "
            "a resumed worker skips its expected share of the steps done"
        )
        lines += _ps_variables(layout.strategy.options, spec.config["model"], spec.config["data"], topo.ps)
        stale = row.stale_gradients_warning(topo.workers, trainer.steps)
        if stale:
            lines.append(f"WARNING       {stale}")
    elif replicas:
        note = " (one replica per worker without GPUs; W x GPUs with them)" if placement.launch is not None else ""
        lines.append(f"replicas      {replicas}{note}")
        lines.append(
            f"batch         global {batch}, "
            f"per replica {batch // replicas if batch % replicas == 0 else 'does not divide!'}"
        )
    else:
        lines.append("replicas      decided by the GPUs visible at start (else 1 per worker)")
        lines.append(f"batch         global {batch}, split evenly across the replicas")
    if row.name == "multiworker":
        lines.append(_collectives(layout.strategy.options))
    if trainer.accumulate_steps > 1:
        lines.append(
            f"accumulate    {trainer.accumulate_steps} batches of {batch} per step: "
            f"the gradients of {batch * trainer.accumulate_steps} examples, the activations of {batch} in memory"
        )
    lines.append(
        f"compute       {trainer.precision}; XLA {compute.planned_jit(trainer, row)[1]}; "
        f"steps per XLA call {compute.planned_steps_per_xla_call(trainer, spec.checkpoint, row)[1]}"
    )
    data = spec.config["data"]
    plan_line = sources.of(data).plan_line  # a data source's own line, from its own keys
    if plan_line:
        lines = [line for line in lines if not line.startswith("data ")] + [
            plan_line(data, topo.workers if row.multi_process else 1)
        ]
    service = layout.service
    if service:
        lines.append(
            f"data service  a tf.data service: 1 dispatcher, {service.workers} worker(s), {service.mode} "
            f"(tasks dispatcher:0 and dataworker:0..{service.workers - 1}; docs/multi-process.md: data.service)"
        )
    lines.append(f"optimizer     {_optimizer(spec.optimizer, replicas)}")
    if spec.callbacks:
        lines.append(
            "callbacks     "
            + ", ".join(f"{name} ({callback.path})" for name, callback in spec.callbacks.items())
            + ", on the chief (docs/own-project.md)"
        )
    lines.append(f"loggers       {', '.join(_loggers(spec.logger))}")
    steps = trainer.steps if trainer.steps is not None else f"{trainer.epochs} epoch(s)"
    lines.append(
        f"steps         {steps}; {trainer.steps_per_loop} per tf.function call; log every {trainer.log_every}; "
        f"eval every {trainer.eval_every or 'end only'}"
    )
    every = spec.checkpoint.every_steps
    lines.append(
        f"checkpoints   every {every or 'end only'} steps, keep {spec.checkpoint.max_to_keep}, in {spec.checkpoint.dir}"
    )
    run_dir = hydra_run_dir(cfg)
    lines += _checkpoint_size(spec.config, spec.checkpoint.background, str(spec.model.path).rpartition(".")[2], run_dir)
    if run_dir:
        lines.append(
            f"run dir       {run_dir}: .hydra/, metrics.jsonl, summary.json, checkpoints/, tensorboard/"
            + (", logs/<task>.log" if placement.launch is LaunchMode.LOCAL else "")
        )
    return "\n".join(lines)


def _checkpoint_size(config: Mapping[str, Any], background: bool, model_name: str, run_dir) -> list:
    """The checkpoint's size and a save's expected time (core/checkpoint_size.py), and the grace a preemption gives
    the run: the user's cluster.preemption_grace, or the one derived from that time. `config`: the resolved config
    as plain data (its model, data, optimizer, checkpoint and cluster sections)."""
    checkpoint_dir = config["checkpoint"].get("dir") or (f"{run_dir}/checkpoints" if run_dir else None)
    found = checkpoint_size.estimate(config, checkpoint_dir, run_dir)
    lines = checkpoint_size.shown(found, model_name, background)
    given = config["cluster"].get("preemption_grace")
    grace = (
        f"{given:g} s (cluster.preemption_grace)"
        if given is not None
        else f"{checkpoint_size.grace_seconds(found)} s (derived: a save in flight, then the preemption's own, and "
        f"{checkpoint_size.GRACE_MARGIN} s; at least {checkpoint_size.LEAST_GRACE}; cluster.preemption_grace sets it)"
    )
    return lines + [f"  grace       a preemption gives the run {grace}"]


def _optimizer(optimizer: Optimizer, replicas) -> str:
    """The optimizer, its learning rate as the run scales it, its schedule and clipping."""
    scale, lr = optimizer.scale_lr_with_replicas, optimizer.lr
    lr_text = f"{lr} x replicas = {lr * replicas}" if scale and replicas else f"{lr}" + (" x replicas" if scale else "")
    clip = next(
        (
            f"; clip {key} {value} after the sum over replicas"
            for key, value in (("clip_norm", optimizer.clip_norm), ("global_clip_norm", optimizer.global_clip_norm))
            if value is not None
        ),
        "",
    )
    schedule = optimizer.schedule
    if isinstance(schedule, Target):  # a LearningRateSchedule's _target_: its own rates, not optimizer.lr
        lr_text, schedule = ("x replicas" if scale else "its own"), schedule.path
    if optimizer.warmup_steps and schedule != "cosine":
        schedule = f"{schedule} after {optimizer.warmup_steps} steps of warm-up"
    shown = f"{optimizer.name} ({optimizer.target})" if optimizer.name != optimizer.target else optimizer.target
    return f"{shown}, lr {lr_text}, schedule {schedule}{clip}"


def _ps_variables(options: Mapping[str, Any], model: Mapping[str, Any], data: Mapping[str, Any], ps: int) -> list:
    """Where the variables go on the ps tasks (the strategy's `options`: strategy.partitioner), and for
    the default MLP (the `model` section) on images of a known shape (`data`), the bytes on each ps task."""
    settings = strategies.partitioner_settings(options.get("partitioner"), ps)
    if settings:
        line = (
            f"variables     strategy.partitioner: a variable of more than {settings['min_shard_bytes']:,} bytes in "
            f"ceil(bytes / {settings['min_shard_bytes']:,}) shards, at most {settings['max_shards']}; "
            f"variables and shards round-robin over {ps} ps"
        )
    else:
        line = f"variables     whole, round-robin over {ps} ps (strategy.partitioner splits large ones)"
    shapes = (
        checkpoint_size.model_shapes({"model": model, "data": data})
        if model.get("_target_") == "tfdistx.models.mlp"
        else None
    )
    if shapes is None:
        return [line]
    total = sum(strategies.ps_bytes(shapes, 1, None))

    def shares(held):
        return " / ".join(f"{b:,}" for b in held) + f" (largest {max(held) / total:.1%})"

    detail = (
        f"              model=mlp, {total:,} bytes of weights; "
        f"per ps: {shares(strategies.ps_bytes(shapes, ps, settings))}"
    )
    if settings:
        detail += f"; unsplit: {shares(strategies.ps_bytes(shapes, ps, None))}"
    return [line, detail]


def _collectives(options: Mapping[str, Any]) -> str:
    packs = options.get("bytes_per_pack") or 0
    implementation = options.get("communication") or "auto"
    how = strategies.COMMUNICATION_MEANS[implementation]
    return (
        f"collectives   each step: one all-reduce of every gradient, "
        f"{f'in packs of {packs} bytes' if packs else 'in one pack'} (strategy.bytes_per_pack), "
        f"{options.get('all_reduce_dtype') or 'float32'}; the metrics: one sum per tf.function call; "
        f"strategy.communication={implementation} ({how})"
    )


def _unsaid(task) -> str:
    """The metrics line of a task whose config names none."""
    if task.get("name") == "auto":  # tasks/auto.py: known once the data is read
        return (
            "those of the task the data's labels call for (classification, multilabel or regression), once it is read"
        )
    return "(the task reports them)"


def _tasks(layout: Layout, placement) -> list:
    if placement.launch is None:
        return ["placement     this process"]
    return launches.of(placement.launch).plan(layout, placement)  # each launch says its own


def _loggers(logger: Logger) -> list:
    """Where the run's metrics go, as the logger group says (each built-in logger as its row shows it)."""
    return ["metrics.jsonl"] + [builtin_loggers.named(name).shown(target.kwargs) for name, target in logger.on.items()]
