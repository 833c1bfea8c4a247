"""`tfdistx job slurm` (launch/slurm/script.py), in-process: the batch script
for a config asks Slurm for exactly the tasks launch/slurm.from_slurm places
(each rank of such a step is placed, checked with the env Slurm gives),
passes Slurm's notice on to the step and requeues on 42; bash reads it and
gets every override back intact; a bad option is one line and exit 2;
--out never replaces a file. No Slurm here: the real one is
tests/test_slurm.py's (-m system)."""

import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from fake_slurm import run_script
from tfdistx import cli
from tfdistx import launch as launches
from tfdistx.launch import slurm
from tfdistx.launch.slurm import free_ports
from tfdistx.config.resolve import layout_of
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit

SRUN = "srun --kill-on-bad-exit=1 python -m tfdistx "


def export(capsys, *args):
    """(exit code, stdout, stderr) of `tfdistx job slurm ARGS`."""
    with pytest.raises(SystemExit) as leaving:
        cli.main(["job", "slurm", *args])
    out, err = capsys.readouterr()
    return leaving.value.code, out, err


def sbatch_options(text: str) -> list:
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def srun_arguments(text: str, tmp_path) -> list:
    """The step's `python -m tfdistx` arguments as bash reads them (the srun
    line run with printf in its place, run_dir and SLURM_JOB_ID set)."""
    [line] = [line for line in text.splitlines() if line.startswith(SRUN)]
    assert line.endswith(" &")
    body = f'SLURM_JOB_ID=77\nrun_dir="outputs/slurm/${{SLURM_JOB_ID}}"\nprintf "%s\\0" {line[len(SRUN) : -2]}\n'
    printed = subprocess.run(["bash", "-c", body], capture_output=True, check=True, cwd=tmp_path).stdout
    return printed.decode().split("\0")[:-1]


def bash_reads(text: str, tmp_path) -> None:
    script = tmp_path / "check.sh"
    script.write_text(text)
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_a_2x1_multiworker_script_asks_for_two_tasks_passes_the_notice_on_and_requeues_on_42(capsys, tmp_path):
    code, text, err = export(capsys, "strategy=multiworker", "cluster=2x1", "data=synthetic")
    assert code == 0 and err == ""
    assert text.startswith("#!/bin/bash\n")
    assert sbatch_options(text) == ["--nodes=1", "--ntasks=2", "--requeue", "--open-mode=append", "--signal=B:USR1@120"]
    lines = text.splitlines()
    # the notice and a SIGTERM reach the step, whose srun passes them to every task; the wait goes on after either
    assert (
        "trap 'noticed=1; kill -USR1 \"$step\" 2>/dev/null' USR1" in text
        and "trap 'noticed=1; kill -TERM \"$step\" 2>/dev/null' TERM" in text
    )
    assert lines.index("step=$!") == lines.index(next(line for line in lines if line.startswith(SRUN))) + 1
    assert (
        'if [ "$code" -eq 42 ]; then' in lines
        and '    scontrol requeue "$SLURM_JOB_ID"' in lines
        and lines[-1] == 'exit "$code"'
    )
    # the overrides, placed from the step, in a run dir that a requeued job (same id) finds again
    assert srun_arguments(text, tmp_path) == [
        "strategy=multiworker",
        "cluster=2x1",
        "data=synthetic",
        "cluster.launch=slurm",
        "hydra.run.dir=outputs/slurm/77",
    ]
    bash_reads(text, tmp_path)


def test_ps1w2_with_its_evaluator_asks_for_every_task_and_each_rank_of_that_step_is_placed(capsys, tmp_path, configs):
    args = ["strategy=parameter_server", "cluster=ps1w2", "cluster.evaluator=true"]
    code, text, _ = export(
        capsys, *args, "--time", "1-00:00:00", "--partition", "gpu", "--nodes", "2", "--notice", "300"
    )
    assert code == 0
    assert sbatch_options(text) == [
        "--nodes=2",
        "--ntasks=5",
        "--time=1-00:00:00",
        "--partition=gpu",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR1@300",
    ]
    assert "in rank order: chief:0, ps:0, worker:0, worker:1, evaluator:0" in text
    layout = layout_of(configs(*args))
    places = [
        launches.detect(
            layout,
            {
                "SLURM_PROCID": str(rank),
                "SLURM_NTASKS": "5",
                "SLURM_TASKS_PER_NODE": "3,2",
                "SLURM_JOB_NODELIST": "n[1-2]",
                "SLURM_JOB_ID": "7",
            },
        ).task_name
        for rank in range(5)
    ]
    assert places == ["chief:0", "ps:0", "worker:0", "worker:1", "evaluator:0"]
    bash_reads(text, tmp_path)


def test_an_override_with_spaces_and_quotes_reaches_the_step_intact(capsys, tmp_path):
    run_dir = "/tmp/a run 'one' $HOME \"two\""
    override = 'hydra.run.dir="' + run_dir.replace('"', '\\"') + '"'
    code, text, _ = export(capsys, "data=synthetic", override)
    assert code == 0
    assert srun_arguments(text, tmp_path) == [
        "data=synthetic",
        override,
        "cluster.launch=slurm",
    ]  # the user's run dir, not the job's
    assert f"run_dir={shlex.quote(run_dir)}" in text.splitlines()  # as composed, for the requeue's line
    bash_reads(text, tmp_path)


@pytest.mark.parametrize(
    "args, said",
    [
        (["--time", "abc"], "--time='abc': allowed: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (Slurm's --time)"),
        (["--time", "1:2:3:4"], "--time='1:2:3:4': allowed: MM, MM:SS"),
        (["--notice", "0"], "--notice='0': a whole number from 1 to 65535 (seconds)"),
        (["--notice", "1.5"], "--notice='1.5': a whole number from 1 to 65535"),
        (["--notice", "x"], "--notice='x': a whole number from 1 to 65535"),
        (["--time", "2", "--notice", "120"], "--notice='120': must be shorter than --time=2 (120 s)"),
        (["--partition", "a;b"], "--partition='a;b': a Slurm partition name"),
        (["--nodes", "3", "strategy=multiworker", "cluster=2x1"], "--nodes='3': a whole number from 1 to 2"),
        (
            ["cluster.launch=local", "strategy=multiworker", "cluster=2x1"],
            "cluster.launch='local': the script's tasks are placed by the Slurm step",
        ),
        (
            ["strategy=multiworker", "cluster.workers=2:4", "data.batch_size=24", "cluster.elastic.hosts=/etc/hosts"],
            "cluster.workers='2:4': an elastic run needs its processes started by tfdistx's local launcher",
        ),
        (["strategy=mirrored", "cluster.launch=agent"], "strategy='mirrored': an agent on every node"),
        (
            ["cluster.notice_signals=[KILL]"],
            "cluster.notice_signals='KILL': a signal name as Slurm's --signal writes it",
        ),
    ],
)
def test_a_bad_option_is_one_line_naming_it_and_exit_2(capsys, args, said):
    code, out, err = export(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and said in err and "Traceback" not in err, err


def test_out_writes_a_new_file_and_never_replaces_one(capsys, tmp_path):
    code, printed, _ = export(capsys, "data=synthetic")
    new = tmp_path / "train.sbatch"
    code, out, err = export(capsys, "data=synthetic", "--out", str(new))
    assert (code, out) == (0, "") and f"sbatch {new}" in err
    assert new.read_text().splitlines()[2:] == printed.splitlines()[2:]  # the second line: the command that made it
    mine = tmp_path / "mine.sh"
    mine.write_text("my own script\n")
    for there in (mine, new):
        before = there.read_text()
        code, out, err = export(capsys, "data=synthetic", "--out", str(there))
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and "already exists" in err
        assert there.read_text() == before
    code, _, err = export(capsys, "data=synthetic", "--out", str(tmp_path / "no" / "such" / "dir.sh"))
    assert code == 2 and "cannot be written" in err and not (tmp_path / "no").exists()


def test_usr1_is_a_notice_signal_by_default(configs):
    assert layout_of(configs()).cluster.notice_signals == ("USR1",)
    assert layout_of(configs("cluster.notice_signals=[]")).cluster.notice_signals == ()


def test_the_script_docs_clusters_md_shows_is_the_one_the_command_prints(capsys):
    page = (Path(__file__).resolve().parent.parent / "docs" / "clusters.md").read_text().splitlines()
    start = page.index("    #!/bin/bash")
    shown = []
    for line in page[start:]:
        if line and not line.startswith("    "):
            break
        shown.append(line[4:])
    made_by = shlex.split(shown[1][2:])
    code, text, _ = export(capsys, *made_by[3:])
    assert code == 0 and text.splitlines() == shown[: -1 if shown[-1] == "" else None]


def test_an_agent_script_asks_for_min_to_max_nodes_one_agent_each_and_survives_a_lost_node(capsys, tmp_path):
    code, text, err = export(
        capsys,
        "strategy=multiworker",
        "cluster.workers=2:4",
        "cluster.launch=agent",
        "data.batch_size=24",
        "data=synthetic",
    )
    assert code == 0 and err == ""
    assert sbatch_options(text) == [
        "--nodes=2-4",
        "--ntasks-per-node=1",
        "--no-kill",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR1@120",
    ]
    ran = run_script(text, tmp_path)
    assert ran["srun"] == [b"--no-kill", b"--kill-on-bad-exit=0", b"--ntasks-per-node=1", b"python", b"-m", b"tfdistx"]
    # the rendezvous on the node the script runs on (the allocation's first), on a port free there; the run's secret
    *given, store, token_file, run_dir = ran["argv"]
    assert token_file == "cluster.agent.token_file=outputs/slurm/77/logs/rendezvous.key"
    # the run's secret, made by the batch shell once per job in the shared run dir, readable by the user alone,
    # and kept by a requeued job (the script run again)
    secret = tmp_path / "work" / "outputs" / "slurm" / "77" / "logs" / "rendezvous.key"
    made = secret.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", made) and secret.stat().st_mode & 0o777 == 0o600
    run_script(text, tmp_path)
    assert secret.read_text() == made and sorted(p.name for p in secret.parent.iterdir()) == ["rendezvous.key"]
    assert (
        given
        == [
            "tfdistx",
            "strategy=multiworker",
            "cluster.workers=4",
            "cluster.elastic.min_workers=2",
            "cluster.launch=agent",
            "data.batch_size=24",
            "data=synthetic",
        ][1:]
        and run_dir == "hydra.run.dir=outputs/slurm/77"
    )
    host, _, port = store.removeprefix("cluster.agent.store=").partition(":")
    assert host == "node07" and 29400 <= int(port) < 29400 + 64 * 500
    code, out, err = export(capsys, "strategy=multiworker", "cluster=2x1", "cluster.launch=agent", "--nodes", "2")
    assert code == 2 and out == "" and "--nodes='2': with cluster.launch=agent there is one agent per node" in err, err
    code, text, _ = export(
        capsys, "strategy=multiworker", "cluster=2x1", "cluster.launch=agent", "cluster.agent.store=head:5000"
    )
    assert "--nodes=2" in sbatch_options(text) and "\nstore=" not in text and "cluster.agent.store=head:5000" in text
    code, text, _ = export(
        capsys, "strategy=multiworker", "cluster=2x1", "cluster.launch=agent", "cluster.agent.token_file=/shared/key"
    )  # a secret of the user's own, on a path every node reads: the script makes none
    assert "\ntoken_file=" not in text and " cluster.agent.token_file=/shared/key " in text


# -- issue 60, item 7: the GPUs, CPUs and memory the tasks need, asked of Slurm ----------------------------------


@pytest.mark.parametrize(
    "args, asked, per_worker",
    [
        (  # the issue's: 4 nodes of 8 GPUs, a worker on each
            ["strategy=multiworker", "cluster=4x8", "--partition", "gpu", "--nodes", "4", "--gpus"],
            ["--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu"],
            "8",
        ),
        (["strategy=multiworker", "cluster=2x1", "--gpus"], ["--nodes=1", "--ntasks=2", "--gpus-per-node=2"], "1"),
        (  # chief and ps first in rank order: the second node holds both workers
            ["strategy=parameter_server", "cluster=ps1w2", "--nodes", "2", "--gpus"],
            ["--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--gpus-per-node=2"],
            "1",
        ),
        (
            ["strategy=multiworker", "cluster=2x4", "--gpus", "8", "--cpus-per-task", "6", "--mem", "64G"],
            ["--nodes=1", "--ntasks=2", "--gpus-per-node=8", "--cpus-per-task=6", "--mem=64G"],
            "4",
        ),
        (
            ["strategy=multiworker", "cluster=2x1", "--cpus-per-task", "4"],
            ["--nodes=1", "--ntasks=2", "--cpus-per-task=4"],
            None,
        ),
        (  # an agent a node: its worker's GPUs
            ["strategy=multiworker", "cluster=2x4", "cluster.launch=agent", "--gpus", "--mem", "0"],
            ["--nodes=2", "--ntasks-per-node=1", "--no-kill", "--gpus-per-node=4", "--mem=0"],
            None,
        ),
    ],
)
def test_the_script_asks_slurm_for_the_gpus_cpus_and_memory_of_its_tasks(capsys, tmp_path, args, asked, per_worker):
    code, text, err = export(capsys, *args)
    assert code == 0, err
    assert sbatch_options(text) == [*asked, "--requeue", "--open-mode=append", "--signal=B:USR1@120"]
    ran = run_script(text, tmp_path)
    assert ran["code"] == 0 and ran["env"][2] == (per_worker or "unset"), ran  # TFDISTX_GPUS_PER_WORKER


def test_fewer_gpus_per_node_than_its_workers_take_is_one_line(capsys):
    code, out, err = export(capsys, "strategy=multiworker", "cluster=2x4", "--gpus", "4")
    assert (code, out) == (2, "") and err.strip() == (
        "tfdistx: invalid config: --gpus='4': a node holds up to 2 worker(s), each taking 4 GPU(s) "
        "(cluster.devices_per_worker): at least 8, or --gpus without a count"
    )


def slurm_env(rank: int, per_node: str, nodelist: str, **more) -> dict:
    ntasks = sum(int(n) for n in per_node.split(","))
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_ID": "77",
        **more,
    }


def test_each_worker_takes_its_own_gpus_of_its_node_and_the_other_tasks_none(configs):
    ps = layout_of(configs("strategy=parameter_server", "cluster=ps1w2"))
    env = {slurm.GPUS_PER_WORKER_ENV: "1", "CUDA_VISIBLE_DEVICES": "3,5"}
    gpus = [launches.detect(ps, slurm_env(rank, "2,2", "n[1-2]", **env)).gpus for rank in range(4)]
    assert gpus == ["", "", "3", "5"]  # chief, ps: none; worker:0 and worker:1 share the second node's two
    two = layout_of(configs("strategy=multiworker", "cluster=2x4"))
    env = {slurm.GPUS_PER_WORKER_ENV: "4"}  # no CUDA_VISIBLE_DEVICES: every GPU of the node is seen
    assert [launches.detect(two, slurm_env(rank, "2", "n1", **env)).gpus for rank in range(2)] == [
        "0,1,2,3",
        "4,5,6,7",
    ]
    assert launches.detect(two, slurm_env(1, "2", "n1")).gpus is None  # no --gpus: as the process has it
    with pytest.raises(ConfigError, match="worker 1 is worker 2 on its node and takes 4 GPU"):
        launches.detect(two, slurm_env(1, "2", "n1", CUDA_VISIBLE_DEVICES="0,1,2,3,4", **env))
    # one process beside its tf.data service: the trainer keeps its GPUs, the service's tasks take none
    fed = layout_of(configs("strategy=mirrored", "cluster=1x2", "data.service.workers=1"))
    env = {slurm.GPUS_PER_WORKER_ENV: "2"}
    assert [launches.detect(fed, slurm_env(rank, "3", "n1", **env)).gpus for rank in range(3)] == ["0,1", "", ""]


# -- issue 60, item 9b: the agents' script says 0 only for a training this step ended -------------------------------


def test_the_agents_script_turns_a_failure_into_0_only_when_this_step_wrote_the_summary(capsys, tmp_path):
    code, text, _ = export(capsys, "strategy=multiworker", "cluster=2x1", "cluster.launch=agent")
    assert code == 0
    run_dir = tmp_path / "work" / "outputs" / "slurm" / "77"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text('{"step": 600}\n')  # an earlier run's, finished
    ran = run_script(text, tmp_path, code=3)  # a full disk now
    assert ran["code"] == 3 and ran["scontrol"] == [], ran["stderr"]
    # the training ended in this step (a new summary.json), and a lost node's agent left with its own code
    ran = run_script(text, tmp_path, code=5, summary_in="outputs/slurm/77")
    assert ran["code"] == 0, ran["stderr"]
    ran = run_script(text, tmp_path, code=5)  # nothing new: the lost node's code stands
    assert ran["code"] == 5


# -- issue 60, item 10: ports free on each node, and a port taken costs a retry -------------------------------------


def test_the_step_listens_on_the_ports_each_node_said_were_free(configs):
    layout = layout_of(configs("strategy=parameter_server", "cluster=ps1w2"))
    ports = {slurm.SLURM_PORTS_ENV: "n1 40001 40007\nn2 40002 40003 40009"}
    place = launches.detect(layout, slurm_env(3, "2,2", "n[1-2]", **ports))
    assert place.cluster_spec == {"chief": ["n1:40001"], "ps": ["n1:40007"], "worker": ["n2:40002", "n2:40003"]}
    derived = launches.detect(layout, slurm_env(3, "2,2", "n[1-2]")).cluster_spec  # a plain srun: as before
    assert derived["worker"] == [f"n2:{29400 + 64 * 77}", f"n2:{29400 + 64 * 77 + 1}"]
    with pytest.raises(ConfigError, match="too few ports for node n2"):
        launches.detect(layout, slurm_env(3, "2,2", "n[1-2]", **{slurm.SLURM_PORTS_ENV: "n1 1 2\nn2 3"}))


def test_a_port_something_holds_is_never_given(tmp_path):
    first = slurm.slurm_first_port(29400, "77")
    with socket.socket() as held:
        held.bind(("", first))  # another job's task, say, on the port job 77 would derive
        held.listen()
        found = free_ports.free_ports(29400, 3, "77")
    assert first not in found and len(set(found)) == 3 and all(29400 <= p < 29400 + 64 * 500 for p in found)


def test_the_script_hands_the_free_ports_to_the_step_and_requeues_when_one_was_taken(capsys, tmp_path):
    code, text, _ = export(capsys, "strategy=multiworker", "cluster=2x1")
    assert code == 0
    ran = run_script(text, tmp_path)
    node, *ports = ran["env"][1].split()  # TFDISTX_SLURM_PORTS, from the probe on this node
    assert node == "node07" and len(set(ports)) == 2 and ran["scontrol"] == []
    ran = run_script(text, tmp_path, code=6)  # a task found its port taken as it started
    assert ran["code"] == 6 and ran["scontrol"] == ["requeue", "77"]
    assert "a task's port was taken on its node: requeueing job 77" in ran["stderr"]


@pytest.mark.parametrize(
    "tasks, srun_code, code, requeued",
    [
        ("1:3 0:42", 42, 3, False),  # a full disk on worker:1; srun stopped worker:0, which saved and said 42
        ("0:6 1:42", 42, 6, True),  # a port taken: requeued to start on other ports
        ("1:42 0:42", 42, 42, True),  # both stopped by a signal of their own: a preemption, requeued
        ("0:0 1:0", 0, 0, False),  # trained to the end
    ],
    ids=["a failure", "a port taken", "preempted", "done"],
)
def test_a_fixed_steps_job_ends_with_the_code_of_the_task_that_failed_first(
    capsys, tmp_path, tasks, srun_code, code, requeued
):
    """srun --kill-on-bad-exit stops a failed task's peers, which checkpoint and exit 42 as on a preemption, and
    reports the largest code: the job requeued itself as preempted, and failed again, for ever. Each task leaves its
    code (commands/ending.py); without a notice, the job's code is the first failure's."""
    exported, text, _ = export(capsys, "strategy=multiworker", "cluster=2x1")
    assert exported == 0
    ran = run_script(text, tmp_path, code=srun_code, tasks=tasks)
    assert ran["code"] == code, ran["stderr"]
    assert (ran["scontrol"] == ["requeue", "77"]) is requeued, ran
    said = "the step's task 1 ended first, with exit code 3; srun stopped the others: the job ends with 3"
    assert (said in ran["stderr"]) is (code == 3), ran["stderr"]


def test_a_run_dir_holding_what_the_script_made_for_the_run_is_the_runs_own(tmp_path):
    """The script makes the run dir's logs/exit-codes (and an agents' run's logs/rendezvous.key) before the run
    starts: the run's checks take them for its own, not for files in its way."""
    from tfdistx import rundir

    run_dir = tmp_path / "run"
    (run_dir / "logs" / "exit-codes").mkdir(parents=True)
    (run_dir / "logs" / "rendezvous.key").write_text("0" * 64)
    assert rundir.in_the_way(str(run_dir)) == []
    (run_dir / "logs" / "worker-0.log").write_text("another run's\n")
    assert rundir.in_the_way(str(run_dir)) == ["logs/"]
