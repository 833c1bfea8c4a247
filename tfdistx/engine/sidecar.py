"""The sidecar evaluator (`cluster.evaluator=true`): a process beside the
training cluster that evaluates each checkpoint the run saves, as
tf.keras.utils.SidecarEvaluator does for Keras, but with tfdistx's own
checkpoints and its own evaluation: the checkpoint is restored and evaluated
exactly as `tfdistx evaluate RUN_DIR --step N strategy=one_device` does
(build_run, Checkpointer.restore, the runner's evaluate), so the metrics are
the same numbers.

For each checkpoint it appends a line to the run's evaluations.jsonl (with
`"sidecar": true`; `tfdistx evaluate`'s lines have no such key) and writes
the `eval/` scalars into `tensorboard/eval/`: a run of its own beside the
training's, with the same tags as the training's own evaluations, so
TensorBoard draws both on one chart.

It never slows or blocks training: it is in no cluster spec (nobody waits for
it), it only reads the checkpoint directory, and only checkpoints whose save
has finished (the run names a checkpoint in its state file once it is
whole: engine/checkpoint_writer.py); one that `checkpoint.max_to_keep` deletes before it is read
is skipped. It stops once it has evaluated the final checkpoint (the one at
the run's last step, or the last before the chief wrote summary.json: an
early stop), or once told to stop by SIGTERM (Kubeflow's cleanPodPolicy deletes
its pod when the chief is done): then it evaluates the newest checkpoint not
yet evaluated, within the pod's grace period, and exits. It never fails the run: whatever stops it is said in one line,
and the process exits 0 (a scheduler such as Kubeflow's fails the whole job
when any replica fails).

Where it stands in a cluster is cluster/evaluator.py's.
"""

import contextlib
import glob
import json
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Dict, List

import tensorflow as tf

from tfdistx import whole_files
from tfdistx.checkpoint_files import step_of
from tfdistx.cluster import liveness
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.cluster.placement import Placement
from tfdistx.core import strategies
from tfdistx.core.errors import EXIT_CLUSTER_DID_NOT_FORM, ConfigError, RunFault
from tfdistx.core.run_spec import RunSpec, Strategy
from tfdistx.engine import checkpointing, process_wide
from tfdistx.loggers import sinks
from tfdistx.engine.build import Run, build_run
from tfdistx.engine.runner import make_runner
from tfdistx.sigterm import SigtermNotice

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0  # between looks at the checkpoint directory: a stat or two, nothing the training notices
TENSORBOARD_DIR = "eval"  # inside the run's tensorboard/: TensorBoard shows it as a run named "eval"


def run(spec: RunSpec, placement: Placement, notice: SigtermNotice) -> None:
    """Evaluate the run's checkpoints until training is done. Returns
    normally whatever happens (the process exits 0), except when training
    is gone (a RunFault, exit 4); any other failure is one line."""
    started = time.time()
    try:
        Sidecar(spec, started, Training(placement, spec.cluster), notice).run()
    except RunFault:
        raise
    except Exception as error:  # KeyboardInterrupt and SystemExit pass: Ctrl-C and the launcher's stop
        if os.environ.get("TFDISTX_TRACEBACK", "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__
        print(
            f"tfdistx: the sidecar evaluator stopped ({reason}); training goes on without it",
            file=sys.stderr,
            flush=True,
        )


class Sidecar:
    def __init__(self, spec: RunSpec, started: float, training: "Training", notice: SigtermNotice):
        self.spec, self.started, self.training, self.notice = spec, started, training, notice
        notice.plan = ""  # said once it has evaluated the newest checkpoint
        self.directory = spec.checkpoint.dir
        # checkpoint.restore=false: the chief sets the old run's checkpoints aside when it starts, which may be
        # after this process first looks; theirs are older than this process.
        self.not_before = 0.0 if spec.checkpoint.restore else started
        self.handled: Dict[int, str] = {}  # step -> "evaluated" or why it was skipped
        self.last_waiting_note = 0.0

    def run(self) -> None:
        # It evaluates alone, in one process: TensorFlow must not take the TF_CONFIG its scheduler gave it
        # (task type "evaluator") for a place in the training cluster.
        os.environ.pop("TF_CONFIG", None)
        with process_wide.settings_for(self.spec.trainer.seed, deterministic=False):
            self.evaluate_each_checkpoint(build_run(on_one_device(self.spec), Placement(task_type=EVALUATOR)))

    def evaluate_each_checkpoint(self, built: Run) -> None:
        history = evaluated_before(built.dir / "evaluations.jsonl")
        board = None
        if "tensorboard" in self.spec.logger.on:
            board = sinks.TensorBoardLogger(str(built.dir / "tensorboard" / TENSORBOARD_DIR))
        with contextlib.closing(built.checkpointer), contextlib.closing(board) if board else contextlib.nullcontext():
            runner = make_runner(built, train=False)
            log.info(
                "sidecar evaluator: evaluating each checkpoint in %s as it is saved, to step %d",
                self.directory,
                built.total_steps,
            )
            while True:
                # looked at before the last scan: the final checkpoint precedes the summary
                ended = self.training_ended(built.dir)
                todo = []
                for path in complete_checkpoints(self.directory):
                    step = step_of(path)
                    if step in self.handled or _mtime(path) < self.not_before:
                        continue
                    if history.get(step, -1.0) >= _mtime(
                        path
                    ):  # a restarted evaluator: this one is in evaluations.jsonl
                        self.handled[step] = "evaluated before"
                        continue
                    todo.append((path, step))
                for i, (path, step) in enumerate(todo):
                    if self.stopping and i < len(todo) - 1:
                        continue  # told to stop: only the newest is worth the time left
                    self.evaluate(built, runner, path, step, board)
                if ended or self.stopping or any(step >= built.total_steps for step in self.handled):
                    break
                self.training.check_still_there(evaluated=sum(why == "evaluated" for why in self.handled.values()))
                self.note_waiting()
                time.sleep(POLL_SECONDS)
            if self.stopping:
                log.info("sidecar evaluator: stopped by SIGTERM after evaluating the newest checkpoint")
        evaluated = sum(1 for why in self.handled.values() if why == "evaluated")
        log.info(
            "sidecar evaluator: training is done; %d checkpoint(s) evaluated into %s",
            evaluated,
            built.dir / "evaluations.jsonl",
        )

    def evaluate(self, built: Run, runner, path: str, step: int, board) -> None:
        name = os.path.basename(path)
        try:
            built.checkpointer.restore(path)  # whole, or refused, as `tfdistx evaluate` restores
        except (checkpointing.Damaged, ConfigError) as error:
            if not _whole_on_disk(
                path
            ):  # deleted while it was read (its files go one by one): checkpoint.max_to_keep rotated it out
                log.warning(
                    "sidecar evaluator: %s was deleted (checkpoint.max_to_keep) before it could be read: skipped", name
                )
                self.handled[step] = "deleted"
                return
            if isinstance(error, ConfigError):  # another model's checkpoint: training refuses it as well
                raise
            log.warning("sidecar evaluator: %s cannot be read (%s): skipped", name, error)
            self.handled[step] = "damaged"
            return
        metrics = runner.evaluate()
        record = {
            "checkpoint": name,
            "step": int(built.step_counter.numpy()),
            "strategy": built.strategy_name,
            "replicas": built.replicas,
            **metrics,
            "sidecar": True,
            "evaluated_at": round(time.time(), 3),
        }
        whole_files.append_jsonl(built.dir / "evaluations.jsonl", record)
        if board:
            board(record["step"], metrics)
        self.handled[step] = "evaluated"
        log.info(
            "sidecar evaluator: %s (step %d): %s",
            name,
            record["step"],
            ", ".join(f"{k} {v:.6g}" for k, v in metrics.items()),
        )

    @property
    def stopping(self) -> bool:
        """SIGTERM (Kubeflow's cleanPodPolicy, the launcher's stop): evaluate the newest checkpoint, then stop."""
        return self.notice.received.is_set()

    def training_ended(self, run_dir: Path) -> bool:
        """The chief has written summary.json (in `run_dir`) since this process started, or
        it stopped early at a checkpoint already evaluated (a rerun)."""
        path = Path(run_dir) / "summary.json"
        try:
            if path.stat().st_mtime >= self.started:
                return True
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        return bool(summary.get("stopped_early")) and summary.get("step") in self.handled

    def note_waiting(self) -> None:
        """Now and then, that it waits (a pod without a shared volume sees no checkpoint, ever)."""
        if time.monotonic() - self.last_waiting_note >= 300:
            if self.last_waiting_note:
                log.info("sidecar evaluator: waiting for the next checkpoint in %s", self.directory)
            self.last_waiting_note = time.monotonic()


class Training:
    """Whether the training this evaluator serves is still there: its chief
    (the task that writes the checkpoints) answers (cluster/liveness.py).
    Without it no checkpoint can come, so waiting is bounded: the chief must
    first answer within `cluster.startup_timeout`, and then never be silent
    for `cluster.peer_timeout` in a row."""

    def __init__(self, placement: Placement, cluster):
        self.name, self.address = _chief(placement)
        self.startup_timeout, self.peer_timeout = cluster.startup_timeout, cluster.peer_timeout
        self.seen, self.silent_since, self.next_look = False, time.monotonic(), 0.0

    def check_still_there(self, evaluated: int) -> None:
        """Raises a RunFault (exit 4) once the chief has been silent too long."""
        now = time.monotonic()
        if self.address is None or now < self.next_look:
            return
        self.next_look = now + liveness.INTERVAL_SECONDS
        if liveness.answers(self.address):
            self.seen, self.silent_since = True, time.monotonic()
            return
        if self.seen and time.monotonic() - self.silent_since >= self.peer_timeout:
            silence = f"has not answered for {self.peer_timeout:g}s (cluster.peer_timeout)"
        elif not self.seen and time.monotonic() - self.silent_since >= self.startup_timeout:
            silence = f"did not answer within {self.startup_timeout:g}s (cluster.startup_timeout)"
        else:
            return
        raise RunFault(
            f"the sidecar evaluator stops: no training to evaluate ({self.name} at {self.address} {silence}); "
            f"{evaluated} checkpoint(s) evaluated (exit {EXIT_CLUSTER_DID_NOT_FORM})",
            EXIT_CLUSTER_DID_NOT_FORM,
        )


def _chief(placement: Placement):
    """(name, address) of the task that writes the run's checkpoints; (None, None) when the spec has none."""
    for job in ("chief", "worker"):
        if placement.cluster_spec.get(job):
            return f"{job}:0", placement.cluster_spec[job][0]
    return None, None


def on_one_device(spec: RunSpec) -> RunSpec:
    """The run's spec for one process on one device: the model, data, task and
    checkpoints are the run's; the strategy is one_device, whatever trained."""
    return replace(
        spec,
        strategy=Strategy("one_device", MappingProxyType({}), strategies.STRATEGIES["one_device"]),
        cluster=replace(spec.cluster, workers=1, ps=0, devices_per_worker=None),
    )


def complete_checkpoints(directory: str) -> List[str]:
    """The checkpoints on disk whose save has finished, oldest first: those
    the state file names (written once a save is whole), and any
    older than another on disk (saves come one after another)."""
    paths = checkpointing.on_disk(directory)
    try:
        state = tf.train.get_checkpoint_state(directory)
        named = {os.path.basename(p) for p in state.all_model_checkpoint_paths} if state else set()
    except Exception:  # a damaged state file: the order of the files still tells
        named = set()
    return [path for i, path in enumerate(paths) if i < len(paths) - 1 or os.path.basename(path) in named]


def evaluated_before(path: Path) -> Dict[int, float]:
    """step -> when the sidecar evaluated it, from evaluations.jsonl (a restarted
    cluster's evaluator goes on where the last one stopped)."""
    done = {}
    try:
        records = whole_files.read_jsonl(path)  # without the lines cut short
    except OSError:
        return done
    for _, record in records:
        try:
            if record.get("sidecar"):
                done[int(record["step"])] = float(record.get("evaluated_at", 0.0))
        except (ValueError, KeyError, TypeError):
            continue  # a field of another type
    return done


def _whole_on_disk(path: str) -> bool:
    """A checkpoint's index and every data shard are on disk (a deletion, file by file, leaves some)."""
    shards = glob.glob(glob.escape(path) + ".data-*-of-*")
    wanted = {int(shard.rpartition("-of-")[2]) for shard in shards}
    return os.path.exists(path + ".index") and len(wanted) == 1 and len(shards) == wanted.pop()


def _mtime(path: str) -> float:
    try:
        return os.stat(path + ".index").st_mtime
    except OSError:
        return 0.0
