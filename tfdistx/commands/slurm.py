"""`tfdistx export slurm [overrides]`: a Slurm batch script for the
composed config, printed or written to a new file: `sbatch` it.

The script asks for one Slurm task per TensorFlow task (as
cluster/placement.from_slurm places them: scheduled_tasks, in rank order),
runs them as one `srun` step of `python -m tfdistx OVERRIDES` in a run dir
fixed for the job, and keeps the run going across Slurm's limits: Slurm
sends USR1 to the batch shell `--notice` seconds before `--time` ends
(`--signal=B:USR1@N`), the shell passes it (and a SIGTERM) on to the step,
every task checkpoints and exits 42 (cluster.notice_signals, sigterm.py),
and on 42 the job requeues itself and resumes from that checkpoint. The
run is fixed-size: a task that fails ends the step (--kill-on-bad-exit).

With `cluster.launch=agent` the script runs an agent on each node instead
(cluster/agent.py): one Slurm task per node, MIN to MAX nodes for
`cluster.workers=MIN:MAX`, and `--no-kill`, so that a failed node shrinks
the run (the agents form a round without it) instead of ending the job.
Only the script's text is written here; what it runs is the config's.
"""

import argparse
import math
import os
import re
import shlex
import sys
from typing import List, Optional

from omegaconf import OmegaConf

from tfdistx.cluster.placement import scheduled_tasks
from tfdistx.commands.common import compose, one_line_errors
from tfdistx.config import userconf
from tfdistx.spec import agent, elastic
from tfdistx.spec.errors import EXIT_PREEMPTED, ConfigError
from tfdistx.config.resolve import layout_of
from tfdistx.spec.strategies import describe_jobs

DEFAULT_NOTICE = (
    120  # seconds, the least notice: more when the checkpoint's expected save needs it (cluster.preemption_grace)
)
MOST_NOTICE = 65535  # sbatch --signal's @sig_time is a 16-bit count of seconds
# The run dir, fixed for the job: a requeued job keeps its id, and resumes there (shell text: $SLURM_JOB_ID is the job's)
RUN_DIR = "outputs/slurm/${SLURM_JOB_ID}"
# Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (Slurm's --time)"
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
# cluster.launch values under which the tasks take their place from the Slurm step (cluster/placement.py)
_PLACED_BY_SLURM = ("auto", "slurm")


def notice_for(grace: float) -> int:
    """The script's --signal lead: the grace a preemption gives the run (cluster.preemption_grace: the user's, or
    derived from the checkpoint's expected save, spec/checkpoint_size.py), at least DEFAULT_NOTICE."""
    return min(MOST_NOTICE, max(DEFAULT_NOTICE, math.ceil(grace)))


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="tfdistx export slurm",
        description="Print a Slurm batch script that runs `python -m tfdistx OVERRIDES` as one srun step, one Slurm task per "
        "TensorFlow task; Slurm's time-limit notice and a preemption checkpoint the run, and the job requeues "
        "itself to resume it. For fixed-size runs. sbatch it. See docs/clusters.md.",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as for a run: strategy=multiworker cluster=2x1")
    parser.add_argument("--time", help=f"the job's time limit: {TIME_FORMATS} (default: the partition's)")
    parser.add_argument(
        "--notice",
        help=f"seconds before the time limit at which Slurm sends USR1: the run checkpoints and the job "
        f"requeues (default: cluster.preemption_grace, at least {DEFAULT_NOTICE}: derived from the checkpoint's "
        "expected save time unless set; docs/preemption.md)",
    )
    parser.add_argument("--partition", help="the Slurm partition (default: the cluster's default)")
    parser.add_argument("--nodes", help="nodes the tasks are spread over (default: 1)")
    parser.add_argument("--out", help="write the script to this new file (never replacing one) instead of printing it")
    with one_line_errors():
        args = parser.parse_intermixed_args(argv)
        notice = _positive("--notice", args.notice, MOST_NOTICE, "seconds") if args.notice is not None else None
        limit = _seconds(args.time) if args.time is not None else None
        if limit and notice and notice >= limit:
            raise ConfigError.one(
                "--notice",
                args.notice,
                f"must be shorter than --time={args.time} ({limit} s): the notice "
                "comes that many seconds before the limit",
            )
        if args.partition is not None and not _PARTITION.fullmatch(args.partition):
            raise ConfigError.one(
                "--partition", args.partition, "a Slurm partition name (letters, digits, _ . -; several: a,b)"
            )
        overrides = elastic.expand_shorthand(args.overrides)
        given = {override.lstrip("+").partition("=")[0] for override in overrides}
        # Under agents the script names the rendezvous (the allocation's first node), unless the overrides do:
        # checked here with a stand-in, as a run would check the one the script gives.
        stand_in = [] if "cluster.agent.store" in given else ["cluster.agent.store=first-node:1"]
        cfg = compose([*overrides, *stand_in])
        layout = layout_of(cfg)
        agents = layout.cluster.launch == agent.LAUNCH
        if agents and args.nodes:
            raise ConfigError.one(
                "--nodes",
                args.nodes,
                "with cluster.launch=agent there is one agent per node, and the nodes are "
                f"cluster.workers={_node_range(layout.cluster)}: leave --nodes out",
            )
        if layout.cluster.elastic and not agents:
            raise ConfigError.one(
                "cluster.elastic.min_workers",
                layout.cluster.elastic.min_workers,
                f"a Slurm step has a fixed number of tasks, and elastic rounds ({elastic.shown(layout.cluster)}) "
                "are formed by tfdistx's local launcher or its agents: export with cluster.launch=agent, "
                "or cluster.elastic.min_workers=null",
            )
        if layout.cluster.launch not in (*_PLACED_BY_SLURM, agent.LAUNCH):
            raise ConfigError.one(
                "cluster.launch",
                layout.cluster.launch,
                "the script's tasks are placed by the Slurm step: "
                f"{', '.join(_PLACED_BY_SLURM)}, or agent (an agent on every node)",
            )
        if notice is None:  # the grace a preemption gives the run (the user's, or derived from its save): the lead
            notice = notice_for(layout.cluster.preemption_grace)
            if limit and notice >= limit:
                raise ConfigError.one(
                    "--time",
                    args.time,
                    f"must be longer than the notice a checkpoint needs, {notice} s (cluster.preemption_grace, at "
                    f"least {DEFAULT_NOTICE}; --plan shows the save's expected time): a longer --time, or --notice",
                )
        tasks = scheduled_tasks(layout)
        ntasks = sum(tasks.values())
        nodes = (
            _positive("--nodes", args.nodes, ntasks, f"nodes, at most the {ntasks} task(s) of the step")
            if args.nodes
            else 1
        )
        run_dir = (
            OmegaConf.select(cfg, "hydra.run.dir") if "hydra.run.dir" in given else None
        )  # as composed: Hydra's quotes gone
        job = _agents(layout.cluster, layout.servers_beside_the_keeper(), given) if agents else _tasks(tasks, nodes)
        text = script(argv, overrides, job, args.time, notice, args.partition, os.environ.get(userconf.ENV), run_dir)
        if args.out:
            _write_new(args.out, text)
    if args.out:
        print(f"tfdistx: wrote {args.out}: sbatch {shlex.quote(args.out)}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


class _Job:
    """What differs between a step of one Slurm task per TensorFlow task and
    a step of one agent per node: the script's words, its sbatch options,
    its srun, what it adds to the command."""

    def __init__(
        self,
        kind: str,
        about: List[str],
        sbatch: List[str],
        srun: str,
        added: List[str],
        setup: List[str],
        ended: List[str],
    ):
        self.kind, self.about, self.sbatch, self.srun, self.added, self.setup, self.ended = (
            kind,
            about,
            sbatch,
            srun,
            added,
            setup,
            ended,
        )


def _tasks(tasks, nodes: int) -> _Job:
    ntasks = sum(tasks.values())
    ranks = ", ".join(f"{job}:{index}" for job, n in tasks.items() for index in range(n))
    return _Job(
        "A fixed-size run (docs/clusters.md).",
        [f"# {describe_jobs(tasks)}: {ntasks} Slurm task(s), one per TensorFlow task, in rank order: {ranks}"],
        [f"--nodes={nodes}", f"--ntasks={ntasks}"],
        "srun --kill-on-bad-exit=1",
        ["cluster.launch=slurm"],
        [],
        [],
    )


def _node_range(cluster) -> str:
    low = cluster.elastic.min_workers if cluster.elastic else cluster.workers
    return f"{low}:{cluster.workers}" if low != cluster.workers else str(cluster.workers)


def _agents(cluster, servers, given) -> _Job:
    """An agent on each node: `--nodes=MIN-MAX`, one task a node; the rendezvous
    on the first node of the allocation (cluster.agent.store, unless given),
    on a port shifted per job as a fixed step's tasks' ports are."""
    low = cluster.elastic.min_workers if cluster.elastic else cluster.workers
    nodes = f"{low}-{cluster.workers}" if low != cluster.workers else str(cluster.workers)
    setup, added = [], []
    if "cluster.agent.store" not in given:
        setup = [
            'store="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'
            f":$(( {cluster.base_port} + 64 * (SLURM_JOB_ID % 500) ))\"  # the rendezvous, kept by the first node's agent"
        ]
        added = ['"cluster.agent.store=${store}"']
    servers = f" (the first node's also {describe_jobs(servers)})" if servers else ""
    about = [
        f"# an agent on every node (cluster.launch=agent): {nodes} node(s), one Slurm task each, each starting its node's worker{servers};",
        "# --no-kill: a failed node leaves the job, and the agents go on without it while cluster.elastic.min_workers remain",
    ]
    # A lost node's agent may end the step with its own code after the others trained to the end: summary.json says they did.
    ended = [
        'if [ "$code" -ne 42 ] && [ -f "${run_dir}/summary.json" ]; then',
        "    code=0  # trained to the end (a lost node's agent may have ended otherwise)",
        "fi",
    ]
    return _Job(
        "An agent on every node (docs/elastic.md).",
        about,
        [f"--nodes={nodes}", "--ntasks-per-node=1", "--no-kill"],
        "srun --no-kill --kill-on-bad-exit=0 --ntasks-per-node=1",
        added,
        setup,
        ended,
    )


def script(
    argv,
    overrides: List[str],
    job: _Job,
    time: Optional[str],
    notice: int,
    partition: Optional[str],
    config_path: Optional[str],
    run_dir: Optional[str] = None,
) -> str:
    """The batch script's text; every value in it shell-quoted. `run_dir`: the
    run dir the overrides set (else one fixed for the job, RUN_DIR)."""
    command = list(overrides)
    given = {override.lstrip("+").partition("=")[0] for override in overrides}
    if "cluster.launch" not in given:  # not a TF_CONFIG that sbatch carried over from the submitting shell
        command += [added for added in job.added if added.startswith("cluster.launch=")]
    made_by = (
        " ".join(shlex.quote(arg) for arg in ["tfdistx", "export", "slurm", *argv])
        .replace("\n", "\\n")
        .replace("\r", "\\r")
    )
    sbatch = [
        *job.sbatch,
        *([f"--time={time}"] if time else []),
        *([f"--partition={partition}"] if partition else []),
        "--requeue",
        "--open-mode=append",
        f"--signal=B:USR1@{notice}",
    ]
    lines = [
        "#!/bin/bash",
        f"# {made_by}",
        *job.about,
        *(f"#SBATCH {shlex.quote(option)}" for option in sbatch),
        "",
        f"# {job.kind} Slurm sends USR1 to this shell {notice} s before the time limit, and SIGTERM on a",
        "# preemption or scancel: both are passed on to the step (srun passes them to every task), whose tasks checkpoint",
        f"# at their next loop boundary and exit {EXIT_PREEMPTED}. On {EXIT_PREEMPTED} the job requeues itself "
        "and resumes from that checkpoint in the same",
        "# run dir; any other code ends the job with it (0: trained to the end; docs/preemption.md lists the others).",
        "set -u",
    ]
    if config_path:
        lines.append(f"export {userconf.ENV}={shlex.quote(config_path)}")
    extra = [added for added in job.added if not added.startswith("cluster.launch=")]
    if run_dir is not None:
        run = " ".join([*(shlex.quote(arg) for arg in command), *extra])
        lines.append(f"run_dir={shlex.quote(run_dir)}")
    else:
        run = " ".join([*(shlex.quote(arg) for arg in command), *extra, '"hydra.run.dir=${run_dir}"'])
        lines.append(f'run_dir="{RUN_DIR}"  # the same for a requeued job: it resumes there')
    lines += [
        *job.setup,
        "step=",
        "trap 'kill -USR1 \"$step\" 2>/dev/null' USR1  # Slurm's time-limit notice (--signal=B:USR1@...)",
        "trap 'kill -TERM \"$step\" 2>/dev/null' TERM  # a preemption, scancel",
        f"{job.srun} python -m tfdistx {run} &",
        "step=$!",
        "while :; do",
        '    wait "$step"',
        "    code=$?",
        '    kill -0 "$step" 2>/dev/null || break  # the step ended (else a signal above cut the wait short)',
        "done",
        *job.ended,
        f'if [ "$code" -eq {EXIT_PREEMPTED} ]; then',
        '    echo "tfdistx: preempted, checkpoint saved in ${run_dir}: requeueing job ${SLURM_JOB_ID} to resume it" >&2',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def _positive(option: str, value: str, most: int, what: str) -> int:
    if not re.fullmatch(r"\d+", value.strip()) or not 1 <= int(value) <= most:
        raise ConfigError.one(option, value, f"a whole number from 1 to {most} ({what})")
    return int(value)


def _seconds(value: str) -> int:
    """Slurm's --time in seconds (0: no limit); a value in none of its formats is refused."""
    m = _TIME.fullmatch(value)  # as given: it goes into the script as it is
    if not m:
        raise ConfigError.one("--time", value, f"allowed: {TIME_FORMATS}")
    days, first, second, third = m.groups()
    if days is None:  # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = (0, first, second) if third is None else (first, second, third)
    elif third is None:  # D-HH, D-HH:MM
        hours, minutes, seconds = first, second or 0, 0
    else:  # D-HH:MM:SS
        hours, minutes, seconds = first, second, third
    return ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + int(seconds or 0)


def _write_new(path: str, text: str) -> None:
    """A new file, or nothing: an existing one (a script, or anything else) is never replaced."""
    try:
        with open(path, "x") as out:
            out.write(text)
    except FileExistsError:
        raise ConfigError.one(
            "--out", path, "already exists: tfdistx export slurm never replaces a file; give a new name"
        ) from None
    except OSError as error:
        raise ConfigError.one("--out", path, f"cannot be written ({error.strerror})") from None
