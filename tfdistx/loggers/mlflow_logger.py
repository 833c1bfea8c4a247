"""MLflow: the run's config as params, its metrics per log step, and its
export as artifacts, to `logger.mlflow.tracking_uri`, else
MLFLOW_TRACKING_URI, else a SQLite store of the run's own,
`<run dir>/mlflow.db` (MLflow 3's recommended local store; its file store
is deprecated), with the artifacts beside it in `<run dir>/mlartifacts`.
One store per run: the runs of a sweep, started together, never write one
SQLite file at once (a shared store is a tracking server, or one you name).

The MLflow run is this run's: its id is kept in `<run dir>/mlflow.json`,
and a resumed run logs on into it. A metric point is sent once a
checkpoint at or after its step is saved: a point past the newest
checkpoint could be trained and logged again after a resume, and MLflow
has no way to take a point back, so a killed run's last points wait in
this process and go with it (metrics.jsonl drops them on resume too); the
points of a checkpoint a killed run saved but had not sent yet are sent
from metrics.jsonl when it resumes (mlflow.json keeps the last step sent). A
tracking server that does not answer within `logger.mlflow.timeout`
seconds is not waited on: one warning, and the run logs to its own local
store instead, so training never waits on it and nothing is lost. The
client is `mlflow-skinny` (the `mlflow` extra), imported only when this
logger is on.
"""

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from tfdistx.checkpoint_files import newest_step
from tfdistx.loggers import BuiltInLogger
from tfdistx.core import paths
from tfdistx.core.errors import first_line
from tfdistx.whole_files import read_jsonl, write_whole

log = logging.getLogger(__name__)

RUN_FILE = "mlflow.json"
STORE_FILE = "mlflow.db"  # the run's own store (no tracking_uri, no MLFLOW_TRACKING_URI)
ARTIFACTS_DIR = "mlartifacts"  # that store's artifacts: in the run dir too, not in the directory the run started from
_MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch limit
_MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit
_MAX_PARAM_VALUE = 6000  # MLflow's limit on a param's value, in characters


def local_store(run_dir: Path) -> str:
    return f"sqlite:///{(Path(run_dir) / STORE_FILE).resolve()}"


class MlflowLogger(BuiltInLogger):
    """logger.mlflow (see above)."""

    name, seconds, files = "mlflow", ("timeout",), (RUN_FILE, STORE_FILE, ARTIFACTS_DIR)

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        experiment: str,
        tracking_uri: Optional[str],
        run_name: Optional[str],
        timeout: float,
        checkpoint_dir: Optional[Path] = None,
        logged: Sequence[dict] = (),
    ):
        """`logged`: the records metrics.jsonl holds as the run starts (a resumed run's, up to its checkpoint)."""
        # Bounded waits: MLflow's HTTP client otherwise retries for minutes (7 tries, 120 s each).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout))))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        for name in (
            "mlflow.store.db.utils",
            "alembic",
        ):  # "Creating initial MLflow database tables...": a new store's chatter
            logging.getLogger(name).setLevel(logging.WARNING)
        self.run_dir = run_dir
        checkpoints = Path(paths.checkpoint_dir(checkpoint_dir, run_dir))
        self.saved_up_to = lambda: newest_step(checkpoints)  # the newest checkpoint's step when asked (None: none yet)
        self.pending: List[Tuple[int, int, dict]] = []  # (step, time in ms, metrics) past the newest checkpoint
        uri, local = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or local_store(run_dir), local_store(run_dir)
        try:
            self.client, self.run_id = self._open(uri, experiment, run_name or run_dir.name, config)
        except Exception as error:  # MlflowException, a refused or timed-out connection: all mean "not now"
            if uri == local:
                raise
            log.warning(
                "MLflow at %s is unreachable (%s): logging to %s instead", uri, first_line(error, most=160), local
            )
            self.client, self.run_id = self._open(local, experiment, run_name or run_dir.name, config)
        self._catch_up(logged)

    @classmethod
    def for_run(
        cls,
        run_dir: Path,
        config: Mapping[str, Any],
        experiment: str = "tfdistx",
        tracking_uri: Optional[str] = None,
        run_name: Optional[str] = None,
        timeout: float = 30.0,
    ) -> "MlflowLogger":
        """logger.mlflow: checkpoints where the run's resolved config says
        (checkpoint.dir, else the run dir's), and the records metrics.jsonl holds as the run starts."""
        checkpoint_dir = Path(paths.checkpoint_dir((config.get("checkpoint") or {}).get("dir"), run_dir))
        return cls(
            Path(run_dir),
            config,
            experiment,
            tracking_uri,
            run_name,
            timeout,
            checkpoint_dir=checkpoint_dir,
            logged=[record for _, record in read_jsonl(Path(run_dir) / "metrics.jsonl")],
        )

    @classmethod
    def shown(cls, keys: Mapping[str, Any]) -> str:
        return f"mlflow ({keys['tracking_uri'] or 'MLFLOW_TRACKING_URI, else <run dir>/mlflow.db'})"

    def _catch_up(self, logged: Sequence[dict]) -> None:
        """The points metrics.jsonl holds up to the newest checkpoint that this
        MLflow run was not sent: a run killed after a checkpoint, before the
        next record sent that checkpoint's points, resumes after their step
        and never logs them again (and a run new to this store gets them all)."""
        sent = max((kept_run(self.run_dir) or {}).get("sent_up_to", 0), self._last_step_stored(logged))
        for record in logged:
            step = record.get("step")
            if isinstance(step, int) and step > sent:
                self.pending.append((step, int(time.time() * 1000), {k: v for k, v in record.items() if k != "step"}))
        self._send_final()

    def _last_step_stored(self, logged: Sequence[dict]) -> int:
        """The last step MLflow already holds of this run: a run killed after a
        batch was stored but before mlflow.json said so must not send it twice
        (log_batch stores a batch whole or not at all)."""
        keys = [key for record in logged[:1] for key in record if key != "step"]
        if not keys:
            return 0
        return max((metric.step for metric in self.client.get_metric_history(self.run_id, keys[0])), default=0)

    def _open(self, uri: str, experiment: str, run_name: str, config: Mapping[str, Any]):
        from mlflow.tracking import MlflowClient

        client, self.uri = MlflowClient(tracking_uri=uri), uri
        kept = kept_run(self.run_dir)
        if kept and kept.get("tracking_uri") == uri and kept.get("run_id"):  # a resumed run: on into its MLflow run
            client.update_run(kept["run_id"], status="RUNNING")
            return client, kept["run_id"]
        found = client.get_experiment_by_name(experiment)
        if found:
            experiment_id = found.experiment_id
        else:
            # the run's own store keeps its artifacts in the run dir as well (MLflow's default is ./mlruns, where the
            # run started)
            artifacts = (self.run_dir / ARTIFACTS_DIR).resolve().as_uri() if uri == local_store(self.run_dir) else None
            experiment_id = client.create_experiment(experiment, artifact_location=artifacts)
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        self._keep(uri, run_id, sent_up_to=0)
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_MAX_PARAM_VALUE]) for key, value in sorted(_flat(config).items())]
        for at in range(0, len(params), _MAX_PARAMS_PER_CALL):
            client.log_batch(run_id, params=params[at : at + _MAX_PARAMS_PER_CALL])
        return client, run_id

    def __call__(self, step: int, metrics: dict) -> None:
        self.pending.append((step, int(time.time() * 1000), dict(metrics)))
        self._send_final()

    def close(self) -> None:
        self._send_final()  # the run's last checkpoint (its end, a preemption's) makes its last points final
        self.client.set_terminated(self.run_id)

    def _send_final(self) -> None:
        """The points at or before the newest checkpoint: a resume never trains their steps again."""
        newest = self.saved_up_to()
        final = [point for point in self.pending if newest is not None and point[0] <= newest]
        if not final:
            return
        from mlflow.entities import Metric

        metrics = [Metric(key, float(value), at, step) for step, at, values in final for key, value in values.items()]
        for start in range(0, len(metrics), _MAX_METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + _MAX_METRICS_PER_CALL])
        self.pending = self.pending[len(final) :]
        self._keep(self.uri, self.run_id, sent_up_to=final[-1][0])

    def _keep(self, uri: str, run_id: str, sent_up_to: int) -> None:
        """<run dir>/mlflow.json: the MLflow run a resumed run logs on into, and the last step it was sent."""
        # whole or not at all: a kill mid-write leaves the last one
        write_whole(
            self.run_dir / RUN_FILE,
            json.dumps({"tracking_uri": uri, "run_id": run_id, "sent_up_to": sent_up_to}) + "\n",
        )


def kept_run(run_dir: Path) -> Optional[dict]:
    """The run dir's MLflow run: {"tracking_uri", "run_id"}; None when it has none."""
    try:
        return json.loads((run_dir / RUN_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def log_export(run_dir: Path) -> None:
    """The run's export/ as the MLflow run's artifacts (after finish writes it)."""
    kept = kept_run(run_dir)
    if not kept:
        return
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=kept["tracking_uri"]).log_artifacts(kept["run_id"], str(run_dir / "export"), "export")
    except Exception as error:  # the export stays in the run dir either way
        log.warning(
            "MLflow: the export was not uploaded (%s); it is in %s", first_line(error, most=160), run_dir / "export"
        )


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
