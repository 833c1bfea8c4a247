"""The logger group's checks, before TensorFlow starts: its switches, the
W&B and MLflow keys, and the MLflow store a run would log to (a value
MLflow refuses would otherwise stop the run once TensorFlow has started,
with MLflow's own exception). No TensorFlow, no MLflow here.
"""

import importlib.metadata
import importlib.util
import os
from pathlib import Path
from typing import List
from urllib.parse import unquote, urlparse

from omegaconf import DictConfig, OmegaConf

from tfdistx import loggers as builtin_loggers
from tfdistx.core.errors import Problem
from tfdistx.core.values import is_number

MAX_EXPERIMENT_NAME = 500  # MLflow's limit on an experiment's name
MAX_RUN_NAME = 250  # the length MLflow's SQL stores keep a run's name in
INSTALL = "pip install 'tfdistx[mlflow]'"
TRACKING_ENV = "MLFLOW_TRACKING_URI"
# The schemes MLflow 3 has a tracking store for, beside sqlite and its file store (mlflow/tracking/_tracking_service/
# utils.py: _register_tracking_stores); a database's with its driver too (postgresql+psycopg2); a plugin's scheme is
# registered under the `mlflow.tracking_store` entry points. Any other one MLflow refuses only once the run has started.
TRACKING_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc", "postgresql", "mysql", "mssql")
PLUGIN_STORES = "mlflow.tracking_store"


def problems(logger: DictConfig) -> List[Problem]:
    found = [
        Problem(f"logger.{row.name}", logger[row.name], "allowed: true, false")
        for row in builtin_loggers.switches()
        if row.name in logger and not isinstance(logger[row.name], bool)
    ]
    for row in builtin_loggers.blocks():
        found += _service_keys(logger, row.name, row.keys())
    found += [
        _not_a_logger(name, logger[name])
        for name in logger
        if builtin_loggers.named(name) is None and not (OmegaConf.is_dict(logger[name]) and "_target_" in logger[name])
    ]
    for key in [f"{row.name}.{seconds}" for row in builtin_loggers.built_in() for seconds in row.seconds]:
        timeout = OmegaConf.select(logger, key)
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            found.append(Problem(f"logger.{key}", timeout, "seconds, more than 0"))
    if OmegaConf.select(logger, "mlflow.enabled") is True:
        found += _mlflow(logger.mlflow)
    if OmegaConf.is_dict(logger.get("wandb")):
        found += _wandb(logger.wandb)
    return found


def _wandb(keys: DictConfig) -> List[Problem]:
    """W&B's keys, as W&B would refuse them once TensorFlow has started (a mode it does not know, a name too long)."""
    from tfdistx.loggers.wandb_logger import MAX_GROUP, MAX_JOB_TYPE, MODES  # plain Python: no W&B client imported

    texts = {
        "project": (False, None, "the name of a W&B project"),
        "entity": (True, None, "a W&B team or user, or null: the API key's default"),
        "group": (True, MAX_GROUP, "null: a multirun's sweep, a single run none"),
        "name": (True, None, "null: a multirun's overrides, a single run's run dir name"),
        "job_type": (True, MAX_JOB_TYPE, "e.g. train"),
        "notes": (True, None, "any text"),
    }
    found = []
    mode = keys.get("mode")
    if mode is not None and mode not in MODES:
        found.append(
            Problem(
                "logger.wandb.mode", mode, f"allowed: {', '.join(MODES)}, or null: online with an API key, else offline"
            )
        )
    for key, (nullable, longest, allowed) in texts.items():
        value = keys.get(key)
        if key not in keys or value is None and nullable:  # not given: the class's default
            continue
        if not isinstance(value, str) or not value.strip() or (longest and len(value) > longest):
            size = f"1 to {longest} characters" if longest else "a text"
            found.append(
                Problem(f"logger.wandb.{key}", _shown(value), f"{size}{' or null' if nullable else ''}: {allowed}")
            )
    tags = keys.get("tags")
    if tags is not None and (
        not OmegaConf.is_list(tags)
        or not all(
            isinstance(tag, (str, int, float)) and not isinstance(tag, bool) and 0 < len(str(tag)) <= 64 for tag in tags
        )
    ):
        found.append(Problem("logger.wandb.tags", _shown(tags), "a list of tags, each 1 to 64 characters"))
    if "log_model" in keys and not isinstance(keys.log_model, bool):
        found.append(Problem("logger.wandb.log_model", keys.log_model, "allowed: true, false"))
    return found


def _not_a_logger(name: str, value) -> Problem:
    """`logger.foo.bar=1`: neither a built-in logger nor one of the user's (no _target_), which would do nothing."""
    built_in = ", ".join(row.name for row in builtin_loggers.built_in())
    return Problem(
        f"logger.{name}",
        _shown(value),
        f"no such logger; the built-in: {built_in}; or your own: logger.{name}._target_=your.Logger",
    )


def _service_keys(logger: DictConfig, service: str, defaults: dict) -> List[Problem]:
    """logger.wandb / logger.mlflow: a switch that is true or false, and no key the service does not take."""
    keys = logger.get(service)
    if keys is None or not OmegaConf.is_dict(keys):
        return []
    found = []
    if "enabled" in keys and not isinstance(keys.enabled, bool):
        found.append(Problem(f"logger.{service}.enabled", keys.enabled, "allowed: true, false"))
    takes = ["enabled", *defaults]
    found += [
        Problem(
            f"logger.{service}.{key}",
            _shown(keys[key]),
            f"logger.{service} has no such key; its keys: {', '.join(takes)}",
        )
        for key in keys
        if key not in takes
    ]
    return found


def _mlflow(keys: DictConfig) -> List[Problem]:
    found = []
    experiment = keys.get("experiment", builtin_loggers.named("mlflow").keys()["experiment"])
    if not isinstance(experiment, str) or not experiment.strip() or len(experiment) > MAX_EXPERIMENT_NAME:
        found.append(
            Problem(
                "logger.mlflow.experiment",
                experiment,
                f"the name of an MLflow experiment: 1 to {MAX_EXPERIMENT_NAME} characters",
            )
        )
    run_name = keys.get("run_name")
    if run_name is not None and (not isinstance(run_name, str) or not run_name.strip() or len(run_name) > MAX_RUN_NAME):
        found.append(
            Problem("logger.mlflow.run_name", run_name, f"1 to {MAX_RUN_NAME} characters, or null: the run dir's name")
        )
    if importlib.util.find_spec("mlflow") is None:
        return found + [Problem("logger.mlflow.enabled", True, f"needs the MLflow client: {INSTALL}")]
    uri = keys.get("tracking_uri")
    if uri is not None and (not isinstance(uri, str) or not uri.strip()):
        return found + [
            Problem(
                "logger.mlflow.tracking_uri",
                uri,
                f"a tracking server (http://HOST:5000), a store (sqlite:///PATH/mlflow.db), "
                f"or null: {TRACKING_ENV}, else the run's own store",
            )
        ]
    key, uri = (
        ("logger.mlflow.tracking_uri", uri) if uri is not None else (TRACKING_ENV, os.environ.get(TRACKING_ENV) or None)
    )
    return found + store_problems(key, uri)


def store_problems(key: str, uri) -> List[Problem]:
    """A store MLflow 3 cannot open here: its deprecated file store without
    the opt-in, or a SQLite one without the SQL packages (mlflow-skinny does
    not bring them; the `mlflow` extra does), or in a directory that is not
    there. `uri` None: the run's own SQLite store."""
    if uri is None or uri.startswith("sqlite:"):
        missing = [name for name in ("sqlalchemy", "alembic") if importlib.util.find_spec(name) is None]
        if missing:
            return [
                Problem(
                    key,
                    uri or "the run's own sqlite:///<run dir>/mlflow.db",
                    f"a SQLite store needs {' and '.join(missing)}: {INSTALL}",
                )
            ]
        if uri is None:
            return []
        path = (
            unquote(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else ""
        )  # sqlite:///rel.db, sqlite:////abs.db
        if path and path != ":memory:" and not Path(path).absolute().parent.is_dir():
            return [Problem(key, uri, f"its directory {Path(path).parent} does not exist: make it, or name another")]
        return []
    scheme = urlparse(uri).scheme
    is_file_store = scheme in ("", "file") and uri != "databricks"  # a path, or file:: MLflow's file store
    if is_file_store and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        return [
            Problem(
                key,
                uri,
                "is MLflow's file store, which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true: name a SQLite "
                "store (sqlite:///PATH/mlflow.db) or a server, or leave it null for the run's own store",
            )
        ]
    if not is_file_store and uri not in TRACKING_SCHEMES and not _has_a_store(scheme):
        return [
            Problem(
                key,
                uri,
                f"MLflow has no tracking store for {scheme}: name a tracking server (http://HOST:5000, https://...), "
                "a database (sqlite:///PATH/mlflow.db, postgresql://..., mysql://..., mssql://...) or databricks, or "
                "leave it null for the run's own store",
            )
        ]
    return []


def _has_a_store(scheme: str) -> bool:
    """Whether MLflow opens a tracking store for `scheme`: one of its own, or a plugin's."""
    if scheme.split("+")[0].lower() in TRACKING_SCHEMES:
        return True
    return scheme in {entry.name for entry in importlib.metadata.entry_points(group=PLUGIN_STORES)}


def _shown(value):
    return "{...}" if OmegaConf.is_config(value) else value
