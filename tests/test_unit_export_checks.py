"""The exports check the config as their tasks will run it (issue 60, items
8 and 9): a Slurm step gets the user's config dirs and composes with them;
what every task a scheduler places refuses at its start (`cluster.nice`,
`strategy.communication=mpi`, an elastic run outside the agents) is refused
at export time, in one line, naming the fix. And an override Hydra cannot
parse is one line and exit 2 from every command (item 13)."""

import pytest

from fake_slurm import run_script
from tfdistx import cli
from tfdistx import launch as launches
from tfdistx.commands.common import compose
from tfdistx.config import userconf
from tfdistx.config.resolve import layout_of

pytestmark = pytest.mark.unit

EXPORTS = [["slurm"], ["jobset", "--image", "img:1"], ["tfjob", "--image", "img:1"], ["trainjob", "--image", "img:1"]]


def exit_code_and_output(capsys, argv):
    with pytest.raises(SystemExit) as leaving:
        cli.main(argv)
    out, err = capsys.readouterr()
    return leaving.value.code, out, err


# -- item 8: job slurm --config-dir ------------------------------------------------------------------------------


def test_the_slurm_step_gets_the_config_dir_and_composes_with_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(userconf.ENV, "")  # recorded: what the command adds is undone after the test
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  steps: 23\n")
    monkeypatch.chdir(tmp_path)
    code, text, err = exit_code_and_output(
        capsys, ["job", "slurm", "--config-dir", "conf", "experiment=mine", "strategy=multiworker", "cluster=2x1"]
    )
    assert code == 0, err
    assert err.strip() == (
        f"tfdistx: WARNING: the job's tasks compose with --config-dir {tmp_path / 'conf'}: every node must hold each "
        "of these directories at that path (a shared file system), relative ones under the directory you sbatch from"
    )
    step = run_script(text, tmp_path)["argv"]
    assert step[:2] == ["--config-dir", str(tmp_path / "conf")]
    # the step's command, as a task reads it: in another directory, with no TFDISTX_CONFIG_PATH of its own
    monkeypatch.setenv(userconf.ENV, "")
    monkeypatch.chdir(tmp_path / "work")
    assert compose(userconf.take_flags(step)).trainer.steps == 23


# -- item 9: what every placed task refuses, refused at export ------------------------------------------------------


@pytest.mark.parametrize("export", EXPORTS, ids=lambda e: e[0])
@pytest.mark.parametrize(
    "override, said",
    [
        ("cluster.nice=5", "cluster.nice=5: a local cluster's priority needs its processes started by tfdistx's"),
        (
            "strategy.communication=mpi",
            "strategy.communication='mpi': MPI's communication needs its processes started by tfdistx's local",
        ),
    ],
)
def test_what_every_task_would_refuse_at_its_start_is_refused_at_export(capsys, export, override, said):
    code, out, err = exit_code_and_output(capsys, ["job", *export, "strategy=multiworker", "cluster=2x1", override])
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and said in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["strategy=multiworker", "cluster.workers=2:4", "data.batch_size=24"],  # no hosts: a local run would need them
        ["strategy=multiworker", "cluster.workers=2:4", "data.batch_size=24", "cluster.elastic.hosts=/etc/hosts"],
    ],
)
def test_an_elastic_config_exported_to_slurm_without_agents_names_the_fix(capsys, args):
    code, out, err = exit_code_and_output(capsys, ["job", "slurm", *args])
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert "cluster.workers='2:4': an elastic run" in err and "(cluster.launch=agent)" in err, err


@pytest.mark.parametrize(
    "override, key",
    [
        ("cluster.nice=5", "cluster.nice=5"),
        ("strategy.communication=mpi", "strategy.communication='mpi'"),
        ("cluster.workers=1:2", "cluster.workers='1:2'"),
    ],
)
def test_a_slurm_step_that_keeps_cluster_launch_auto_is_refused_as_its_tasks_would_refuse_it(capsys, override, key):
    """cluster.launch=auto given: the script keeps it, and each task, placed by Slurm, refuses at its start."""
    args = ["strategy=multiworker", "cluster=2x1", "cluster.launch=auto", override]
    if override.startswith("cluster.workers"):
        args.append("cluster.elastic.hosts=/etc/hosts")  # what a local run needs, to reach the placed task's check
    code, out, err = exit_code_and_output(capsys, ["job", "slurm", *args])
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert f"{key}: " in err and "placed by a scheduler" in err, err


def test_a_task_a_scheduler_placed_refuses_mpi_before_tensorflow_starts(configs):
    layout = layout_of(configs("strategy=multiworker", "cluster=2x1", "strategy.communication=mpi"))
    [problem] = launches.refused_in_a_placed_task(layout)
    assert problem.key == "strategy.communication" and "placed by a scheduler" in problem.allowed
    assert launches.refused_in_a_placed_task(layout, launched_by_tfdistx=True) == []


# -- item 13: an override Hydra cannot parse ------------------------------------------------------------------------


@pytest.fixture
def a_run_dir(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("[]\n")
    return run


@pytest.mark.parametrize("bad", ["trainer.steps=$(id)", "trainer.steps='x"])
@pytest.mark.parametrize(
    "command",
    [
        ["job", "slurm"],
        ["job", "jobset", "--image", "img"],
        ["job", "tfjob", "--image", "img"],
        ["job", "trainjob", "--image", "img"],
        ["evaluate", "RUN"],
        ["data", "write", "--out", "OUT"],
        ["recipes", "show", "mnist_mlp"],
        ["--plan"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_an_override_hydra_cannot_parse_is_one_line_and_exit_2_from_every_command(
    capsys, tmp_path, a_run_dir, command, bad
):
    argv = [str(a_run_dir) if w == "RUN" else str(tmp_path / "out") if w == "OUT" else w for w in command]
    try:
        cli.main([*argv, bad])
        code = 0
    except SystemExit as leaving:
        code = leaving.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    key, _, value = bad.partition("=")  # the line names the key, its value and Hydra's own words
    said = f"tfdistx: invalid config: {key}={value!r}: Hydra cannot parse this override: "
    assert code == 2 and len(lines) == 1 and lines[0].startswith(said), err
    assert not (tmp_path / "out").exists()
