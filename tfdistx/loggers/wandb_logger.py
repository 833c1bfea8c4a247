"""Weights & Biases: the run's config, its metrics per log step (the numbers
of metrics.jsonl, digit for digit), its final and best objective in the
summary and, with `log_model`, its export as a model artifact.

Offline unless an API key is configured (or `mode`/`WANDB_MODE` says
otherwise): an offline run writes under <run dir>/wandb, and `wandb sync`
uploads it later; tfdistx never needs the network.

One W&B run per tfdistx run, resumes included: its id is kept in
<run dir>/wandb/tfdistx-run-id, and a resumed run opens it again
(`resume="allow"`; offline, each attempt is a file of its own with that
id, and `wandb sync` uploads them in order, as one run). W&B keeps a step
once and refuses a step lower than its last, so a resumed run sends:
- first, the steps of metrics.jsonl up to its checkpoint that W&B does not
  hold (a hard kill loses what W&B had not yet written to its file: about
  its last 32 kB of records);
- then each new step past the last step W&B holds. A run that resumes
  from a checkpoint older than what W&B holds (killed after W&B wrote steps
  its checkpoint does not have) trains those steps again without sending
  them: W&B keeps their values from before the kill, metrics.jsonl the
  retrained ones.
What W&B holds is read from its own files in <run dir>/wandb (offline and
online alike W&B writes each attempt's records there) and, online, from the
run W&B resumed.

A key without a route to W&B costs at most `init_timeout` seconds: W&B's
host is tried first (name and TCP connection, with any proxy W&B would
use); a host that cannot be reached makes the run offline at once, with
one warning, and a W&B that does not answer within `init_timeout`, after
it. Plain Python: no TensorFlow, no Hydra.
"""

import json
import logging
import math
import netrc
import os
import secrets
import socket
import string
import struct
import threading
import urllib.request
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence
from urllib.parse import urlparse

from tfdistx.loggers import BuiltInLogger
from tfdistx.core.objective import lower_is_better
from tfdistx.whole_files import read_jsonl, write_whole

log = logging.getLogger(__name__)

RUN_ID_FILE = "tfdistx-run-id"  # in <run dir>/wandb: the W&B run this tfdistx run logs into
MODES = ("online", "offline", "disabled")  # what `mode` may be (null: online with a key, else offline)
MAX_GROUP = 128  # W&B's limit on a group's length, in characters
MAX_JOB_TYPE = 64  # and a job type's


class WandbLogger(BuiltInLogger):
    """logger.wandb (see above)."""

    name, seconds, files = "wandb", ("init_timeout",), ("wandb",)
    # Keys whose null the run's job fills when its config is resolved (config/resolve.py): a multirun's runs
    # grouped by their sweep and named by their overrides; a single run named by its run directory.
    from_job = {"group": "sweep", "name": "run"}

    def __init__(
        self,
        run_dir: Path,
        config: Mapping[str, Any],
        start_step: int = 0,
        logged: Sequence[dict] = (),
        project: str = "tfdistx",
        entity: Optional[str] = None,
        mode: Optional[str] = None,
        group: Optional[str] = None,
        name: Optional[str] = None,
        job_type: Optional[str] = "train",
        notes: Optional[str] = None,
        tags: Sequence[str] = (),
        log_model: bool = False,
        init_timeout: float = 30.0,
    ):
        """`logged`: the records metrics.jsonl holds as the run starts (a resumed run's, up to its checkpoint)."""
        import wandb  # deferred: W&B's client only when this logger is on

        self.wandb, self.run_dir, self.config, self.log_model = wandb, Path(run_dir), config, log_model
        folder = self.run_dir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        run_id = kept_id(self.run_dir)
        if run_id is None:  # written before W&B starts: a run killed in its first seconds resumes into the same W&B run
            run_id = new_id()
            write_whole(folder / RUN_ID_FILE, run_id + "\n")
        init = dict(
            project=project,
            entity=entity,
            dir=str(self.run_dir),
            config=dict(config),
            tags=[str(tag) for tag in tags],
            group=group,
            name=name or self.run_dir.name,
            job_type=job_type,
            notes=notes,
            id=run_id,
            resume="allow",
            reinit="finish_previous",
        )
        self.run = self._open(mode or os.environ.get("WANDB_MODE") or _default_mode(), init_timeout, init)
        earlier = [path for path in run_files(self.run_dir, run_id) if path != Path(self.run.settings.sync_file)]
        resumed_at = self.run.starting_step - 1 if self.run.resumed else 0  # online: what W&B's server holds
        self.held = max([resumed_at, *(last_step(path) for path in earlier)])
        self.skipped = False
        self._catch_up(logged, start_step)

    @classmethod
    def for_run(
        cls,
        run_dir: Path,
        config: Mapping[str, Any],
        start_step: int = 0,
        project: str = "tfdistx",
        entity: Optional[str] = None,
        mode: Optional[str] = None,
        group: Optional[str] = None,
        name: Optional[str] = None,
        job_type: Optional[str] = "train",
        notes: Optional[str] = None,
        tags: Sequence[str] = (),
        log_model: bool = False,
        init_timeout: float = 30.0,
    ) -> "WandbLogger":
        """logger.wandb: the run dir's W&B run, and the records metrics.jsonl holds as the run starts."""
        return cls(
            Path(run_dir),
            config,
            start_step,
            [record for _, record in read_jsonl(Path(run_dir) / "metrics.jsonl")],
            project,
            entity,
            mode,
            group,
            name,
            job_type,
            notes,
            tags,
            log_model,
            init_timeout,
        )

    def _open(self, mode: str, init_timeout: float, init: dict):
        wandb = self.wandb
        quiet = wandb.Settings(silent=True)
        if mode != "online":
            return wandb.init(mode=mode, settings=quiet, **init)
        base_url = wandb.setup().settings.base_url
        why = unreachable(base_url, init_timeout)
        if why is None:
            try:  # quiet: its retries would print a screenful; the outcome is said below
                run = wandb.init(mode="online", settings=wandb.Settings(init_timeout=init_timeout, silent=True), **init)
                log.info("W&B run: %s", run.url)
                return run
            except Exception as error:  # wandb's CommError, UsageError, a timeout: all mean "not now"
                why = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        log.warning(
            "W&B is unreachable (%s): logging offline to %s/wandb instead; `wandb sync` uploads it later",
            why,
            self.run_dir,
        )
        return wandb.init(mode="offline", settings=quiet, **init)

    def _catch_up(self, logged: Sequence[dict], start_step: int) -> None:
        """The steps metrics.jsonl holds up to the run's checkpoint that W&B does
        not: what a hard kill kept from reaching W&B's file, sent again."""
        missing = [
            record
            for record in logged
            if isinstance(record.get("step"), int) and self.held < record["step"] <= start_step
        ]
        for record in missing:
            self.run.log({key: value for key, value in record.items() if key != "step"}, step=record["step"])
        if missing:
            log.info(
                "W&B: steps %d to %d sent again from metrics.jsonl (W&B's files held up to step %d)",
                missing[0]["step"],
                missing[-1]["step"],
                self.held,
            )
            self.held = missing[-1]["step"]

    def __call__(self, step: int, metrics: dict) -> None:
        if step <= self.held:  # trained again after a resume from an older checkpoint: W&B keeps a step once
            if not self.skipped:
                log.info(
                    "W&B holds steps up to %d from before this resume: steps %d to %d, trained again, are not sent "
                    "again (metrics.jsonl has them as trained now)",
                    self.held,
                    step,
                    self.held,
                )
                self.skipped = True
            return
        self.run.log(metrics, step=step)

    def finished(self) -> None:
        """After the chief's summary.json and export: the final and best
        objective into the W&B run's summary, and (log_model) the export as
        a model artifact."""
        objective = str((self.config.get("trainer") or {}).get("objective") or "")
        records = [record for _, record in read_jsonl(self.run_dir / "metrics.jsonl")]
        self.run.summary.update(objective_summary(objective, records))
        export = self.run_dir / "export"
        if self.log_model and not (export / "saved_model.pb").is_file():
            log.warning("logger.wandb.log_model: the run wrote no export (checkpoint.export=false): no model artifact")
        elif self.log_model:
            step = _exported_step(self.run_dir, records[-1]["step"] if records else 0)
            artifact = self.wandb.Artifact(
                f"model-{self.run.id}",
                type="model",
                description="the run's export: a TensorFlow SavedModel (serving_default)",
                metadata={"step": step, "run_dir": str(self.run_dir.resolve())},
            )
            artifact.add_dir(str(export))
            self.run.log_artifact(artifact, aliases=["latest", f"step-{step}"])

    def close(self) -> None:
        self.run.finish()


def _exported_step(run_dir: Path, last: int) -> int:
    """The step of the checkpoint the export holds: the best one's (checkpoint.keep_best), else the run's last."""
    try:
        best = json.loads((run_dir / "summary.json").read_text()).get("best") or {}
    except (OSError, ValueError):
        return last
    return int(best["step"]) if best.get("checkpoint") and isinstance(best.get("step"), int) else last


def objective_summary(objective: str, records: Sequence[dict]) -> dict:
    """The objective's final value and its best (the least of a loss, the
    most of the rest) with its step, over every record of metrics.jsonl: a
    resumed run's too, which W&B's own summary of one attempt would miss."""
    values = [
        (record["step"], record[objective])
        for record in records
        if isinstance(record.get(objective), (int, float)) and math.isfinite(record[objective])
    ]
    if not values:
        return {}
    pick = min if lower_is_better(objective) else max
    best_step, best = pick(values, key=lambda pair: pair[1])
    return {
        "objective": objective,
        "objective/final": values[-1][1],
        "objective/best": best,
        "objective/best_step": best_step,
    }


def kept_id(run_dir: Path) -> Optional[str]:
    """The W&B run id the run dir's runs log into; None before its first."""
    try:
        text = (Path(run_dir) / "wandb" / RUN_ID_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return text or None


def new_id() -> str:
    """A W&B run id: 12 lowercase letters and digits (W&B's own are 8)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(12))


def run_files(run_dir: Path, run_id: str) -> List[Path]:
    """The W&B files of this run's attempts in <run dir>/wandb (`run-…` online, `offline-run-…` offline)."""
    return sorted(Path(run_dir, "wandb").glob(f"*run-*-{run_id}*/run-{run_id}.wandb"))


def _default_mode() -> str:
    return "online" if _key_configured() else "offline"


def _key_configured() -> bool:
    """An API key in the environment, or in ~/.netrc for W&B's host (where `wandb login` keeps it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    hosts = {"api.wandb.ai", urlparse(os.environ.get("WANDB_BASE_URL") or "").hostname}
    try:
        keys = netrc.netrc()
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return any(host and keys.authenticators(host) is not None for host in hosts)


def unreachable(url: str, timeout: float) -> Optional[str]:
    """Why W&B's host (or the proxy W&B would use to reach it) cannot be
    reached within `timeout` seconds: its name, then a TCP connection; None
    when it can. In a thread: a name lookup cannot be given a timeout."""
    parsed = urlparse(url)
    proxy = urllib.request.getproxies().get(parsed.scheme)
    if proxy and not urllib.request.proxy_bypass(parsed.hostname or ""):
        parsed = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome: List[Optional[str]] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as error:  # no name, no route, refused, timed out
            outcome.append(f"{host}:{port}: {error.strerror or type(error).__name__}")

    trying = threading.Thread(target=connect, name="wandb-reachable", daemon=True)
    trying.start()
    trying.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer within {timeout:g}s (logger.wandb.init_timeout)"


# -- W&B's run file ---------------------------------------------------------------
# W&B writes each attempt's records to its `.wandb` file: a LevelDB log (a 7-byte header, then 32 KiB blocks of
# chunks, each a 7-byte header and a piece of a record) of `wandb_internal_pb2.Record` protobufs. The Python
# package that reads it was removed from W&B (0.31 reads it in its Go core), so the few lines that find the
# steps a file holds are here: a file whose header is not W&B's counts as holding none.
_HEADER = struct.Struct("<4sHB")  # ":W&B", magic, version
_CHUNK = struct.Struct("<IHB")  # checksum, length, type (1 whole, 2 first, 3 middle, 4 last)
_BLOCK = 32 * 1024


def records(path: Path) -> list:
    """The `Record`s of a W&B run file, in order; those of a chunk cut short by a kill are left out."""
    from wandb.proto import wandb_internal_pb2  # deferred: W&B's client only when this logger is on

    data = Path(path).read_bytes()
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != b":W&B":
        return []
    found, pending, at = [], b"", _HEADER.size
    while at + _CHUNK.size <= len(data):
        left = _BLOCK - at % _BLOCK
        if left < _CHUNK.size:  # a block's tail too short for a chunk header: padding
            at += left
            continue
        _, length, kind = _CHUNK.unpack_from(data, at)
        if kind == 0:  # zeros: the rest of the block is padding
            at += left
            continue
        piece = data[at + _CHUNK.size : at + _CHUNK.size + length]
        at += _CHUNK.size + length
        if len(piece) < length:
            break
        if kind in (1, 2):
            pending = piece
        else:
            pending += piece
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(pending)
            except Exception:  # protobuf's DecodeError: a record torn by a kill
                break
            found.append(record)
            pending = b""
    return found


def history(path: Path) -> List[dict]:
    """The history rows a W&B run file holds: {"_step": N, metric: value, ...} each."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def last_step(path: Path) -> int:
    return max((int(row["_step"]) for row in history(path) if "_step" in row), default=0)
