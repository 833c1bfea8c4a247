"""One reader of the config (-m unit): the composed config is resolved
(config/resolve.py) before placement, the local launcher, `--plan`'s
placement lines and the Kubernetes manifests read it. They take the run
spec's Layout; none of their functions is ever handed a DictConfig.

Checked by watching every call into those modules while `--plan` and the
manifests run on configs that use all they read (a local cluster with the
tf.data service and the sidecar evaluator, an elastic run, a JobSet).
"""

import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, ListConfig

import tfdistx
from config_helpers import compose_ok
from tfdistx import cli
from tfdistx import launch as launches
from tfdistx.launch import jobset as jobset_manifest
from tfdistx.launch import kubernetes
from tfdistx.commands import execute
from tfdistx.commands.plan import describe
from tfdistx.config.resolve import layout_of

pytestmark = pytest.mark.unit

# placement and the supervisor; the launches, their launchers and manifests
PLAIN_SIDE = tuple(str(Path(tfdistx.__file__).parent / room) for room in ("cluster", "launch"))


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    for name in ("TF_CONFIG", "SLURM_PROCID", "JOBSET_NAME"):
        monkeypatch.delenv(name, raising=False)


def handed_a_config(work) -> list:
    """The calls into the cluster modules (and execute's placement and task
    count) that were handed a DictConfig or ListConfig while `work()` ran."""
    found = []

    def watch(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if not (
            code.co_filename.startswith(PLAIN_SIDE)
            or (code.co_filename == execute.__file__ and code.co_name in ("placement_of", "_start_processes"))
        ):
            return
        for name in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
            if isinstance(frame.f_locals.get(name), (DictConfig, ListConfig)):
                found.append(f"{Path(code.co_filename).name}:{code.co_name}({name}=DictConfig)")

    sys.setprofile(watch)
    try:
        work()
    finally:
        sys.setprofile(None)
    return found


def test_plan_places_a_local_cluster_from_the_spec(tmp_path):
    cfg = compose_ok(
        tmp_path / "run",
        "strategy=parameter_server",
        "cluster=ps1w2",
        "cluster.evaluator=true",
        "data.service.workers=1",
    )
    lines = []
    assert handed_a_config(lambda: lines.extend(describe(cfg).splitlines())) == []
    assert any(line.startswith("  task        evaluator:0") for line in lines)  # read from the spec's cluster
    assert any(line.startswith("data service  a tf.data service: 1 dispatcher, 1 worker(s)") for line in lines)


def test_plan_of_an_elastic_run_reads_the_spec(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n127.0.0.2\n")
    cfg = compose_ok(
        tmp_path / "run",
        "strategy=multiworker",
        "cluster.workers=4",
        "cluster.elastic.min_workers=2",
        f"cluster.elastic.hosts={hosts}",
        "data.batch_size=96",
    )
    lines = []
    assert handed_a_config(lambda: lines.extend(describe(cfg).splitlines())) == []
    assert next(line for line in lines if line.startswith("elastic")).startswith(
        "elastic       2:4 workers, one per host listed in"
    )


def test_manifests_are_written_from_the_spec(tmp_path):
    overrides = ["strategy=parameter_server", "cluster=ps1w2", "cluster.max_restarts=5", "data.service.workers=1"]
    layout = layout_of(compose_ok(tmp_path / "run", *overrides))
    made = {}

    def export():
        options = kubernetes.PodOptions(tuple(overrides), "job", "img")
        made["tfjob"] = kubernetes.tfjob(layout, options)
        made["jobset"] = jobset_manifest.jobset_manifest(layout, options)

    assert handed_a_config(export) == []
    assert made["tfjob"]["spec"]["runPolicy"]["backoffLimit"] == 5
    assert made["jobset"]["spec"]["failurePolicy"]["maxRestarts"] == 5


def test_the_slurm_script_is_written_from_the_spec(capsys):
    """`tfdistx job slurm` counts the step's tasks with placement's own scheduled_tasks, handed the Layout."""

    def export():
        with pytest.raises(SystemExit) as leaving:
            cli.main(
                [
                    "job",
                    "slurm",
                    "strategy=parameter_server",
                    "cluster=ps1w2",
                    "cluster.evaluator=true",
                    "data.service.workers=1",
                ]
            )
        assert leaving.value.code == 0

    assert handed_a_config(export) == []
    assert (
        "#SBATCH --ntasks=7" in capsys.readouterr().out.splitlines()
    )  # chief, ps, 2 workers, dispatcher, data worker, evaluator


def test_placement_refuses_to_be_handed_the_composed_config(tmp_path):
    """The seam is the type: placement reads the spec's attributes, and a
    DictConfig handed to it fails at once rather than being read as one."""
    cfg = compose_ok(tmp_path / "run", "strategy=multiworker", "cluster=2x1")
    assert launches.detect(layout_of(cfg), {}).launch.value == "local"
    with pytest.raises(AttributeError):
        launches.detect(cfg, {})
