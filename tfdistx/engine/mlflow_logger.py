"""MLflow: the run's config as params, its metrics per log step, and its
export as artifacts, to `logger.mlflow.tracking_uri`, else
MLFLOW_TRACKING_URI, else a local `mlruns/` in the working directory (as
MLflow's own default; MLflow 3 keeps its file store in maintenance mode,
so tfdistx opts in to it for that local default only).

The MLflow run is this run's: its id is kept in `<run dir>/mlflow.json`,
and a resumed run logs on into it (steps past the checkpoint come again,
as in TensorBoard). A tracking server that does not answer within
`logger.mlflow.timeout` seconds is not waited on: one warning, and the
run logs to the local `mlruns/` instead (every metric is in metrics.jsonl
as well), so training never waits on it and nothing is lost. The client
is `mlflow-skinny` (the `mlflow` extra), imported only when this logger is on.
"""

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

RUN_FILE = "mlflow.json"
_MAX_PARAMS_PER_CALL = 100  # MLflow's log_batch limit
_MAX_PARAM_VALUE = 6000  # MLflow's limit on a param's value, in characters


def local_store() -> str:
    return Path("mlruns").resolve().as_uri()


class MlflowLogger:
    def __init__(self, run_dir: Path, config: Mapping[str, Any], experiment: str, tracking_uri: Optional[str],
                 run_name: Optional[str], timeout: float):
        # Bounded waits: MLflow's HTTP client otherwise retries for minutes (7 tries, 120 s each).
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(max(1, int(timeout))))
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        self.run_dir = run_dir
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or local_store()
        try:
            self.client, self.run_id = self._open(uri, experiment, run_name or run_dir.name, config)
        except Exception as error:  # MlflowException, a refused or timed-out connection: all mean "not now"
            if uri == local_store():
                raise
            log.warning("MLflow at %s is unreachable (%s): logging to %s instead", uri, _first_line(error), local_store())
            self.client, self.run_id = self._open(local_store(), experiment, run_name or run_dir.name, config)

    def _open(self, uri: str, experiment: str, run_name: str, config: Mapping[str, Any]):
        if uri.startswith("file:"):
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a local store (MLflow 3's file store needs this opt-in)
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        kept = kept_run(self.run_dir)
        if kept and kept.get("tracking_uri") == uri and kept.get("run_id"):  # a resumed run: on into its MLflow run
            client.update_run(kept["run_id"], status="RUNNING")
            return client, kept["run_id"]
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        (self.run_dir / RUN_FILE).write_text(json.dumps({"tracking_uri": uri, "run_id": run_id}) + "\n")
        from mlflow.entities import Param

        params = [Param(key, str(value)[:_MAX_PARAM_VALUE]) for key, value in sorted(_flat(config).items())]
        for at in range(0, len(params), _MAX_PARAMS_PER_CALL):
            client.log_batch(run_id, params=params[at:at + _MAX_PARAMS_PER_CALL])
        return client, run_id

    def __call__(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, float(value), now, step) for key, value in metrics.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


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
        log.warning("MLflow: the export was not uploaded (%s); it is in %s", _first_line(error), run_dir / "export")


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
