"""Fit: restore, run the loop, write the summary (cf. Model Garden's
train_lib.run_experiment over a built task). Also `evaluate`, the same
parts without the loop.

Takes a RunSpec (config/spec.py) and a Placement; builds the parts with
engine/build.py and exports with engine/export.py. Only the chief writes
the run directory's files.
"""

import contextlib
import hashlib
import json
import logging
import os
import time
from typing import Optional

import tensorflow as tf

from tfdistx.cluster import liveness
from tfdistx.cluster.placement import Placement, Source
from tfdistx.config.errors import ConfigError
from tfdistx.config.objective import lower_is_better
from tfdistx.config.objective import value as objective_value
from tfdistx.config.spec import RunSpec
from tfdistx.data import input as input_lib
from tfdistx.data.files import input_errors_in_one_line
from tfdistx.engine import checkpointing, loggers, topology
from tfdistx.engine import strategy as strategy_lib
from tfdistx.engine.build import Run, build_run
from tfdistx.engine.data_service import train_service
from tfdistx.engine.export import export_checkpoint
from tfdistx.engine.loop import CheckPreemption, Log, Loop, Result, SaveCheckpoints, Schedule, TrackObjective
from tfdistx.engine.metrics import MetricSet
from tfdistx.engine.preemption import PreemptionWatcher, lost_peer_in_one_line, watching_servers
from tfdistx.engine.profiling import ProfileSteps
from tfdistx.engine.runner import CoordinatorRunner, SyncRunner
from tfdistx.engine.serving import trainer_addresses
from tfdistx.engine.update import Update
from tfdistx.engine.warm_start import warm_start
from tfdistx.internals import tensorflow as internals
from tfdistx.rundir import set_aside_previous_run
from tfdistx.sigterm import SigtermNotice

log = logging.getLogger(__name__)

# Input pipelines of runs whose process ends without tearing them down (see `train`).
_KEPT_UNTIL_EXIT = []


def train(spec: RunSpec, placement: Optional[Placement] = None, process_ends_after: bool = False,
          notice: Optional[SigtermNotice] = None) -> Optional[float]:
    """Train as `spec` says; returns the objective.

    `placement` is this process's task in a cluster (None: a single
    process). `process_ends_after`: the caller ends the process as soon as
    this returns, so the input pipelines are left standing (their teardown
    can wait minutes on tf.data's autotune thread: 77 s measured after a
    mirrored 1x4 run). `notice`: the process's SIGTERM notice (sigterm.py),
    taken from its start; without one, SIGTERM is this run's while it trains.
    """
    if notice is None:
        with SigtermNotice() as notice:
            return train(spec, placement, process_ends_after, notice)
    started = time.time()
    placement = placement or Placement(Source.SINGLE)
    run = build_run(spec, placement, notice)
    if run is None:
        return None  # a parameter-server cluster's ps or worker task: served until stopped

    with reproducible(spec.trainer.deterministic), contextlib.closing(run.checkpointer):
        restored = run.checkpointer.restore_latest() if spec.checkpoint.restore else None
        # Not continued: checkpoint.restore=false, or no checkpoint there can be read. The old run's files are
        # kept aside only once nothing can refuse this run any more (below): a refused run changes nothing.
        starts_over = restored is None and (not spec.checkpoint.restore or run.checkpointer.only_damaged)
        start_step = int(run.step_counter.numpy())
        if start_step > run.total_steps:  # nothing to train, and a summary of nothing would replace the run's
            raise ConfigError.one("trainer.steps", run.total_steps, f"the run in this directory is already at step {start_step} "
                                  f"({os.path.basename(restored)}): ask for {start_step} steps or more, or use another hydra.run.dir")
        tracker = objective_tracker(run)
        if restored and start_step == run.total_steps:
            return already_finished(run, restored, tracker, started)
        if restored and tracker and tracker.exhausted():  # stopped early: as finished, never trained on
            return already_finished(run, restored, tracker, started, stopped_early=True)
        if restored:
            log.info("resuming from step %d (%s)", start_step, restored)
            run.resumed_from_topology = resumed_from_topology(run, restored, start_step)
            if spec.checkpoint.init_from:  # a rerun of a warm-started run resumes, never re-initialises
                log.info("checkpoint.init_from=%s is not applied: it initialises a new run, and this one resumes from its own "
                         "checkpoint", spec.checkpoint.init_from.path)
        elif spec.checkpoint.init_from:
            warm_start(run)
        if starts_over:
            start_over_beside_previous_run(run)
        runner = make_runner(run, skip_steps=start_step)
        log.info("%s: %s, global batch %d, %d steps, task %s", run.strategy_name, run.replicas_text, run.global_batch,
                 run.total_steps, run.task.name)
        if placement.is_chief:
            log.info("run dir: %s", run.dir.resolve())
        result = _fit(run, runner, start_step, notice, tracker)
        if result.stopped_early:
            log.info("stopped early at step %d: %s", result.step, result.stopped_early["reason"])
        final_checkpoint = run.checkpointer.latest
        if spec.checkpoint.keep_best and run.checkpointer.best:
            final_checkpoint = run.checkpointer.best  # the model the run keeps: exported instead of the last

    summary = _summary(run, result, restored, start_step, time.time() - started)
    if placement.is_chief:
        loggers.write_json(run.dir / "summary.json", summary)
        if spec.checkpoint.export and final_checkpoint:
            export_checkpoint(spec, final_checkpoint, str(run.dir / "export"))
        log.info("done at step %d: %s", result.step, run.dir.resolve())
        leave_after_the_other_workers(run)
    if process_ends_after:
        _KEPT_UNTIL_EXIT.append(runner)
    return objective_value(spec.trainer.objective, summary)


def leave_after_the_other_workers(run: Run, most_seconds: float = 10.0) -> None:
    """The chief of a synchronous cluster leads TensorFlow's coordination
    service: a worker that sees it gone while still shutting down reports
    the cluster as crashed ("the leader task was preempted/died", "The tasks
    have crashed") at the end of a run that succeeded. So the chief, done
    after the others (it writes the summary and export), waits until they
    have left, at most `most_seconds`."""
    if not run.placement.in_cluster or run.facts.asynchronous:
        return
    others = {name: address for name, address in trainer_addresses(run.placement, run.facts).items()
              if name != run.placement.task_name}
    liveness.wait_until_gone(others, time.monotonic() + most_seconds)


def _fit(run: Run, runner, start_step: int, notice: SigtermNotice, tracker: Optional[TrackObjective] = None):
    """The loop, with its actions: log, track the objective (the best
    checkpoint, early stopping), checkpoint, stop cleanly when preempted,
    and (in a cluster) when a peer or a server it waits on is lost."""
    spec = run.spec
    schedule = Schedule(run.total_steps, spec.trainer.steps_per_loop, spec.trainer.log_every, spec.trainer.eval_every)
    # A SIGTERM checkpoints and exits 42 (parameter servers: the coordinator
    # saves alone; TF's handler refuses clusters with ps tasks).
    in_cluster = run.placement.in_cluster
    synchronous_cluster = in_cluster and not run.facts.asynchronous
    with lost_peer_in_one_line(synchronous_cluster, parameter_servers=in_cluster and run.facts.asynchronous,
                               placement=run.placement, peer_timeout=spec.cluster.peer_timeout), \
            watching_servers(run.placement, spec.cluster, coordinator=run.coordinator is not None), \
            input_errors_in_one_line(run.source), \
            loggers.for_run(run.dir, dict(spec.logger), run.total_steps, start_step, enabled=run.placement.is_chief,
                            config=_plain(spec.config)) as sinks:
        preemption = PreemptionWatcher(run.strategy, run.checkpointer, synchronous_cluster, notice)
        actions = [Log(sinks), *([tracker] if tracker else []),  # the tracker before the saves: they carry its state
                   SaveCheckpoints(run.checkpointer, spec.checkpoint.every_steps), CheckPreemption(preemption)]
        profile = profile_steps(run)
        with contextlib.closing(profile) if profile else contextlib.nullcontext():  # a failed run's trace is kept too
            return Loop(runner, schedule, run.step_counter, actions + ([profile] if profile else []),
                        learning_rate_at=run.learning_rate.at).run()


def profile_steps(run: Run) -> Optional[ProfileSteps]:
    """The action that traces trainer.profile_steps, into the run's TensorBoard
    directory (whether or not the TensorBoard logger is on: TensorBoard's
    Profile tab reads it there). Only the chief writes; every task stops
    where it does."""
    spec = run.spec
    if spec.trainer.profile_steps is None:
        return None
    start, end = spec.trainer.profile_steps
    if end > run.total_steps and run.placement.is_chief:  # trainer.epochs: validation could not know the steps
        log.warning("trainer.profile_steps=[%d, %d]: the run has %d steps; the trace ends with it", start, end, run.total_steps)
    note = "" if spec.logger.get("tensorboard", True) else " (logger.tensorboard=false: the directory holds only the trace)"
    return ProfileSteps(start, end, (run.dir / "tensorboard").resolve(), writes=run.placement.is_chief, note=note)


def objective_tracker(run: Run) -> Optional[TrackObjective]:
    """The action that keeps the best checkpoint and stops early, when asked for."""
    spec = run.spec
    objective, patience = spec.trainer.objective, spec.trainer.early_stopping.patience
    if not spec.checkpoint.keep_best and patience is None:
        return None
    if spec.checkpoint.keep_best and objective.startswith("eval/") and not spec.trainer.eval_every and run.placement.is_chief:
        log.warning("checkpoint.keep_best: %s is evaluated only at the end (trainer.eval_every=0), so the best checkpoint is "
                    "the last one; set trainer.eval_every to choose among several", objective)
    return TrackObjective(objective, lower_is_better(objective), run.objective_state,
                          save_best=run.checkpointer.save_best if spec.checkpoint.keep_best else None,
                          patience=patience, min_delta=spec.trainer.early_stopping.min_delta)


def _best(run: Run) -> Optional[dict]:
    """The best value of the objective so far, and (checkpoint.keep_best) its checkpoint."""
    spec = run.spec
    state = run.objective_state.read()
    if (not spec.checkpoint.keep_best and spec.trainer.early_stopping.patience is None) or state["best_step"] is None:
        return None
    return {"step": state["best_step"], "value": state["best"], "objective": spec.trainer.objective,
            "checkpoint": run.checkpointer.best if spec.checkpoint.keep_best else None}


def _summary(run: Run, result, restored, start_step: int, wall_time: float) -> dict:
    spec = run.spec
    digest = weights_digest(run.model)
    log.info("task %s: final weights sha256 %s", run.placement.task_name, digest)
    return {
        "step": result.step, "train": result.train, "eval": result.eval, "examples_per_sec": result.examples_per_sec,
        "task": run.task.name, "replicas": run.replicas, "workers": spec.cluster.workers, "ps": spec.cluster.ps,
        "strategy": run.strategy_name, "strategy_class": type(run.strategy).__name__,
        "global_batch": run.global_batch, "per_replica_batch": run.per_replica_batch,
        "accumulate_steps": spec.trainer.accumulate_steps, "precision": spec.trainer.precision, "jit_compile": run.jit_compile,
        "steps_per_xla_call": run.steps_per_xla_call,
        "learning_rate": run.peak_lr, "resumed": bool(restored), "resumed_from_step": start_step if restored else None,
        "train_wall_time_sec": result.wall_time_sec, "wall_time_sec": wall_time,
        "process": run.placement.task_name, "weights_sha256": digest, "variable_devices": variable_devices(run.model),
        "variable_bytes": variable_bytes(run.model),
        "init_from": spec.checkpoint.init_from.path if spec.checkpoint.init_from else None,
        "best": _best(run), "stopped_early": result.stopped_early,
        "resumed_from_topology": run.resumed_from_topology,
    }


def resumed_from_topology(run: Run, restored: str, start_step: int) -> Optional[dict]:
    """The topology the restored checkpoint was written under, when it is
    another than this run's (said in the log); a changed global batch is
    refused (engine/topology.py)."""
    spec = run.spec
    return topology.on_resume(
        topology.written_under(restored), run.topology, batch_size=spec.pipeline.batch_size,
        accumulate_steps=spec.trainer.accumulate_steps, scale_lr_with_replicas=bool(spec.optimizer.get("scale_lr_with_replicas")),
        checkpoint=restored, run_dir=run.dir, start_step=start_step, log_it=run.placement.is_chief,
        in_memory=bool(getattr(run.source.train, "same_order_on_any_topology", False))
        and not (getattr(spec.pipeline, "service", None) or {}).get("workers"))  # the tf.data service shares it out its own way


def start_over_beside_previous_run(run: Run) -> None:
    """A run that is not continued (checkpoint.restore=false, or no checkpoint
    in its dir can be read) starts at step 0 beside the run that was there:
    the chief keeps the old run's files aside instead of writing over them."""
    if run.checkpointer.only_damaged:
        log.warning("no checkpoint in %s can be read: starting from scratch", run.checkpointer.directory)
    if run.placement.is_chief:
        why = "the previous run's files are kept as %s" if run.checkpointer.only_damaged else \
            "checkpoint.restore=false: the previous run's files are kept as %s"
        for kept in set_aside_previous_run(str(run.dir), run.checkpointer.directory):
            log.warning(why, kept)
    run.checkpointer.start_over()


def already_finished(run: Run, restored: str, tracker: Optional[TrackObjective], started: float,
                     stopped_early: bool = False) -> Optional[float]:
    """A rerun of a run that reached trainer.steps (or stopped early: its
    restored objective state says patience was spent) trains nothing and keeps
    what the run wrote: its summary, metrics and export stay as they are.
    Every task evaluates the final checkpoint (the same collective steps
    on each, so none waits for another), and that is the answer: logged,
    appended to evaluations.jsonl, and the objective returned (a sweep's
    rerun reports the same value). A run killed after its last checkpoint
    but before its summary or export is finished here: the chief writes
    what is missing, and only that."""
    step = int(run.step_counter.numpy())
    if stopped_early:
        log.info("the run in this directory stopped early at step %d (%s): trainer.early_stopping.patience=%d evaluations without "
                 "an improvement were spent; nothing to train; its summary, checkpoints and export are kept. To train on, start "
                 "a new run from it (checkpoint.init_from=%s).", step, os.path.basename(restored),
                 run.spec.trainer.early_stopping.patience, run.dir)
    else:
        log.info("the run in this directory finished at step %d (%s): nothing to train; its summary, checkpoints and export "
                 "are kept. Ask for more trainer.steps to train on.", run.total_steps, os.path.basename(restored))
    metrics = make_runner(run, train=False).evaluate()
    log.info("evaluated the final checkpoint: %s", ", ".join(f"{k} {v:.6g}" for k, v in metrics.items()))
    if not run.placement.is_chief:
        return None
    loggers.append_jsonl(run.dir / "evaluations.jsonl", {"checkpoint": os.path.basename(restored), "step": step,
                                                         "strategy": run.strategy_name, "replicas": run.replicas, **metrics})
    summary_path = run.dir / "summary.json"
    if not summary_path.is_file():
        reason = tracker.reason(run.objective_state.read()) if stopped_early else None
        result = Result(step=step, train=last_logged_train(run.dir, step), eval=metrics,
                        stopped_early={"step": step, "reason": reason} if reason else None)
        loggers.write_json(summary_path, _summary(run, result, restored, step, time.time() - started))
        log.info("the run had stopped after its last checkpoint, before its summary: written now (%s)", summary_path)
    final_checkpoint = run.checkpointer.best if run.spec.checkpoint.keep_best and run.checkpointer.best else restored
    if run.spec.checkpoint.export and not (run.dir / "export").exists():
        export_checkpoint(run.spec, final_checkpoint, str(run.dir / "export"))
    return objective_value(run.spec.trainer.objective, json.loads(summary_path.read_text()))


def last_logged_train(run_dir, step: int) -> dict:
    """The train metrics metrics.jsonl holds for `step` (the loop logs the
    last step always), without the evaluation's; {} when it has none."""
    for _, record in reversed(loggers.read_jsonl(run_dir / "metrics.jsonl")):  # the kill may have cut its last line short
        if record.get("step") == step:
            return {k: v for k, v in record.items() if k != "step" and not k.startswith("eval/")}
    return {}


def evaluate(spec: RunSpec, placement: Optional[Placement] = None, step: Optional[int] = None) -> Optional[dict]:
    """Evaluate a kept checkpoint (the newest, or the one at `step`) on the
    configured eval data; the chief appends the metrics to evaluations.jsonl."""
    path = checkpointing.find(spec.checkpoint.dir, step)  # before building anything
    run = build_run(spec, placement or Placement(Source.SINGLE))
    if run is None:
        return None
    with contextlib.closing(run.checkpointer):
        try:
            run.checkpointer.restore(path)  # whole, or refused: never a model left partly at its initial weights
        except checkpointing.Damaged as damage:
            raise ConfigError.one("checkpoint", path, f"cannot be read: {damage}") from None
        metrics = make_runner(run, train=False).evaluate()
    record = {"checkpoint": os.path.basename(path), "step": int(run.step_counter.numpy()), "strategy": run.strategy_name,
              "replicas": run.replicas, **metrics}
    if run.placement.is_chief:
        loggers.append_jsonl(run.dir / "evaluations.jsonl", record)
    return record


def make_runner(run: Run, skip_steps: int = 0, train: bool = True):
    """The step runner for the run's strategy, with its datasets and metrics."""
    spec, pipeline = run.spec, run.spec.pipeline
    metrics = MetricSet(run.task.metrics())
    metrics.build(*run.task.metric_inputs(*run.sample))
    train_data = input_lib.train_dataset(
        run.strategy, run.source, run.global_batch, seed=spec.trainer.seed, shuffle_buffer=pipeline.shuffle_buffer,
        cache=pipeline.cache, skip_steps=skip_steps, ps_workers=run.workers if run.facts.asynchronous else 0,
        service=train_service(pipeline.service, run.placement, skip_steps)) if train else None
    eval_steps = spec.trainer.eval_steps
    update = Update(run.task, run.model, run.optimizer, run.global_batch, spec.trainer.accumulate_steps, jit_compile=run.jit_compile,
                    all_reduce_options=strategy_lib.all_reduce_options(run.strategy_name, spec.strategy.options),
                    whole_step=run.facts.xla_whole_step,
                    all_reduce_dtype=strategy_lib.all_reduce_dtype(run.strategy_name, spec.strategy.options),
                    variables=run.train_variables, learning_rate=run.learning_rate,
                    steps_per_xla_call=run.steps_per_xla_call)
    parts = (run.strategy, run.task, run.model, update, metrics)
    eval_batch = pipeline.batch_size  # not the accumulated batch: what fits in memory
    if run.coordinator is None:
        eval_data = input_lib.eval_dataset(run.strategy, run.source.eval, eval_batch, steps=eval_steps, cache=pipeline.cache)
        return SyncRunner(*parts, train_data=train_data, eval_data=eval_data)
    # evaluated inline on the coordinator, reading the variables from the ps tasks
    eval_data = input_lib.local_eval_dataset(run.source.eval, eval_batch, steps=eval_steps, cache=pipeline.cache)
    return CoordinatorRunner(*parts, coordinator=run.coordinator, workers=run.workers, train_data=train_data, eval_data=eval_data)


@contextlib.contextmanager
def reproducible(deterministic: bool):
    """Op determinism for this run only: a later job of a multirun in the
    same process starts without it unless it asks."""
    was = internals.op_determinism_enabled()
    if deterministic:
        tf.config.experimental.enable_op_determinism()
    try:
        yield
    finally:
        if not was:
            internals.disable_op_determinism()


def weights_digest(model) -> str:
    """A fingerprint of the weights: equal on every worker of a synchronous
    cluster, and equal across runs that should end bitwise identical."""
    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(variable.numpy().tobytes())
    return digest.hexdigest()


def variable_devices(model) -> list:
    """Where the model's variables live (shards of partitioned ones included)."""
    devices = set()
    for variable in model.weights:
        value = variable.value  # Keras 3: the TF variable behind a keras.Variable
        for part in getattr(value, "variables", [value]):  # a ShardedVariable's shards
            devices.add(part.device)
    return sorted(devices)


def variable_bytes(model) -> dict:
    """Bytes of the model's variables on each device (each shard where it lives)."""
    held = {}
    for variable in model.weights:
        value = variable.value
        for part in getattr(value, "variables", [value]):
            held[part.device] = held.get(part.device, 0) + part.shape.num_elements() * part.dtype.size
    return dict(sorted(held.items()))


def _plain(mapping):
    """A MappingProxy tree as plain dicts (what the loggers serialise)."""
    if hasattr(mapping, "items"):
        return {k: _plain(v) for k, v in mapping.items()}
    if isinstance(mapping, list):
        return [_plain(v) for v in mapping]
    return mapping
