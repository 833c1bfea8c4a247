"""The last of a run's phases (engine/fit.py): what a run leaves.

The chief writes summary.json and exports the model it keeps (the best
checkpoint under checkpoint.keep_best, else the last); every task logs a
fingerprint of its final weights (synchronous workers must agree). A rerun
of a run with nothing left to train is finished here too: it keeps what
the run wrote and writes only what a kill left missing.
"""

import hashlib
import json
import logging
import os
import time
from typing import Optional

from tfdistx import whole_files
from tfdistx.cluster import liveness
from tfdistx.cluster.placement import Placement
from tfdistx.core.objective import value as objective_value
from tfdistx.core.strategies import StrategyRow
from tfdistx.engine.build import Run
from tfdistx.engine.export import export_checkpoint
from tfdistx.engine.loop import Result
from tfdistx.engine.runner import make_runner
from tfdistx.engine.serving import trainer_addresses
from tfdistx.engine.start import STOPPED_EARLY, Start

log = logging.getLogger(__name__)


def finish(run: Run, start: Start, result: Result, started: float) -> Optional[float]:
    """Summary and export (the chief), the final weights' fingerprint (every
    task); the objective's value."""
    if result.stopped_early:
        log.info("stopped early at step %d: %s", result.step, result.stopped_early["reason"])
    summary = _summary(run, start, result, time.time() - started)
    if run.placement.is_chief:
        whole_files.write_json(run.dir / "summary.json", summary)
        kept = (
            run.checkpointer.best
            if run.spec.checkpoint.keep_best and run.checkpointer.best
            else run.checkpointer.latest
        )
        if run.spec.checkpoint.export and kept:
            export_checkpoint(run.spec, kept, str(run.dir / "export"))
            if "mlflow" in run.spec.logger.on:
                from tfdistx.loggers.mlflow_logger import log_export  # MLflow's client only when it is on

                log_export(run.dir)
        log.info("done at step %d: %s", result.step, run.dir.resolve())
        leave_after_the_other_workers(run.placement, run.row)
    return objective_value(run.spec.trainer.objective, summary)


def finish_finished_run(run: Run, start: Start, started: float) -> Optional[float]:
    """A rerun of a run that reached trainer.steps (or stopped early: its
    restored objective state says patience was spent) trains nothing and keeps
    what the run wrote: its summary, metrics and export stay as they are.
    Every task evaluates the final checkpoint (the same collective steps
    on each, so none waits for another), and that is the answer: logged,
    appended to evaluations.jsonl, and the objective returned (a sweep's
    rerun reports the same value). A run killed after its last checkpoint
    but before its summary or export is finished here: the chief writes
    what is missing, and only that."""
    step, restored = start.step, start.restored
    if start.finished == STOPPED_EARLY:
        log.info(
            "the run in this directory stopped early at step %d (%s): %s; nothing to train; its summary, "
            "checkpoints and export are kept. To train on, start a new run from it (checkpoint.init_from=%s).",
            step,
            os.path.basename(restored),
            start.stopped_because,
            run.dir,
        )
    else:
        log.info(
            "the run in this directory finished at step %d (%s): nothing to train; its summary, checkpoints and export "
            "are kept. Ask for more trainer.steps to train on.",
            run.total_steps,
            os.path.basename(restored),
        )
    metrics = make_runner(run, train=False).evaluate()
    log.info("evaluated the final checkpoint: %s", ", ".join(f"{k} {v:.6g}" for k, v in metrics.items()))
    if not run.placement.is_chief:
        return None
    whole_files.append_jsonl(
        run.dir / "evaluations.jsonl",
        {
            "checkpoint": os.path.basename(restored),
            "step": step,
            "strategy": run.strategy_name,
            "replicas": run.replicas,
            **metrics,
        },
    )
    summary_path = run.dir / "summary.json"
    if not summary_path.is_file():
        reason = start.stopped_because if start.finished == STOPPED_EARLY else None
        result = Result(
            step=step,
            train=last_logged_train(run.dir, step),
            eval=metrics,
            stopped_early={"step": step, "reason": reason} if reason else None,
        )
        whole_files.write_json(summary_path, _summary(run, start, result, time.time() - started))
        log.info("the run had stopped after its last checkpoint, before its summary: written now (%s)", summary_path)
    final_checkpoint = run.checkpointer.best if run.spec.checkpoint.keep_best and run.checkpointer.best else restored
    if run.spec.checkpoint.export and not (run.dir / "export").exists():
        export_checkpoint(run.spec, final_checkpoint, str(run.dir / "export"))
    return objective_value(run.spec.trainer.objective, json.loads(summary_path.read_text()))


def leave_after_the_other_workers(placement: Placement, row: StrategyRow, most_seconds: float = 10.0) -> None:
    """The chief of a synchronous cluster leads TensorFlow's coordination
    service: a worker that sees it gone while still shutting down reports
    the cluster as crashed ("the leader task was preempted/died", "The tasks
    have crashed") at the end of a run that succeeded. So the chief, done
    after the others (it writes the summary and export), waits until they
    have left, at most `most_seconds`."""
    if not placement.in_cluster or row.asynchronous:
        return
    others = {
        name: address for name, address in trainer_addresses(placement, row).items() if name != placement.task_name
    }
    liveness.wait_until_gone(others, time.monotonic() + most_seconds)


def last_logged_train(run_dir, step: int) -> dict:
    """The train metrics metrics.jsonl holds for `step` (the loop logs the
    last step always), without the evaluation's; {} when it has none."""
    for _, record in reversed(
        whole_files.read_jsonl(run_dir / "metrics.jsonl")
    ):  # the kill may have cut its last line short
        if record.get("step") == step:
            return {k: v for k, v in record.items() if k != "step" and not k.startswith("eval/")}
    return {}


def _summary(run: Run, start: Start, result: Result, wall_time: float) -> dict:
    spec = run.spec
    digest = weights_digest(run.model)
    log.info("task %s: final weights sha256 %s", run.placement.task_name, digest)
    return {
        "step": result.step,
        "train": result.train,
        "eval": result.eval,
        "examples_per_sec": result.examples_per_sec,
        "task": run.task.name,
        "replicas": run.replicas,
        "workers": spec.cluster.workers,
        "ps": spec.cluster.ps,
        "strategy": run.strategy_name,
        "strategy_class": type(run.strategy).__name__,
        "global_batch": run.global_batch,
        "per_replica_batch": run.per_replica_batch,
        "accumulate_steps": spec.trainer.accumulate_steps,
        "precision": spec.trainer.precision,
        "jit_compile": run.jit_compile,
        "steps_per_xla_call": run.steps_per_xla_call,
        "learning_rate": run.peak_lr,
        "resumed": bool(start.restored),
        "resumed_from_step": start.step if start.restored else None,
        "train_wall_time_sec": result.wall_time_sec,
        "wall_time_sec": wall_time,
        "process": run.placement.task_name,
        "weights_sha256": digest,
        "variable_devices": variable_devices(run.model),
        "variable_bytes": variable_bytes(run.model),
        "init_from": spec.checkpoint.init_from.path if spec.checkpoint.init_from else None,
        "best": _best(run),
        "stopped_early": result.stopped_early,
        "resumed_from_topology": start.resumed_from_topology,
        "checkpoint": run.checkpointer.stats.summary(),  # what the saves and the restore took (docs/performance.md)
    }


def _best(run: Run) -> Optional[dict]:
    """The best value of the objective so far, and (checkpoint.keep_best) its checkpoint."""
    spec = run.spec
    state = run.objective_state.read()
    if (not spec.checkpoint.keep_best and spec.trainer.early_stopping.patience is None) or state["best_step"] is None:
        return None
    return {
        "step": state["best_step"],
        "value": state["best"],
        "objective": spec.trainer.objective,
        "checkpoint": run.checkpointer.best if spec.checkpoint.keep_best else None,
    }


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
