"""`tfdistx job slurm [overrides]`: a Slurm batch script for the
composed config, printed or written to a new file: `sbatch` it.

The script asks for one Slurm task per TensorFlow task (as
launch/slurm.from_slurm places them: scheduled_tasks, in rank order),
runs them as one `srun` step of `python -m tfdistx OVERRIDES` in a run dir
fixed for the job, and keeps the run going across Slurm's limits: Slurm
sends USR1 to the batch shell `--notice` seconds before `--time` ends
(`--signal=B:USR1@N`), the shell passes it (and a SIGTERM) on to the step,
every task checkpoints and exits 42 (cluster.notice_signals, sigterm.py),
and on 42 the job requeues itself and resumes from that checkpoint. The
run is fixed-size: a task that fails ends the step (--kill-on-bad-exit).
Before the step, a step of one task a node asks each node for ports free
on it (launch/slurm/free_ports.py), which the tasks take (launch/slurm.from_slurm);
a port taken all the same (exit 6) requeues the job, which asks again.
`--gpus`, `--cpus-per-task` and `--mem` are asked of Slurm, and each worker
task takes its own share of its node's GPUs (launch/slurm.GPUS_PER_WORKER_ENV).
The config is checked as the tasks will run it (common.compose_as_placed).

With `cluster.launch=agent` the script runs an agent on each node instead
(launch/agent/node.py): one Slurm task per node, MIN to MAX nodes for
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
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from tfdistx import emit
from tfdistx.launch.slurm import free_ports
from tfdistx.launch.agent import run_secret
from tfdistx.cluster.placement import scheduled_tasks
from tfdistx.launch.slurm import GPUS_PER_WORKER_ENV, SLURM_PORTS_ENV
from tfdistx.commands.common import compose_as_placed, one_line_errors
from tfdistx.commands.ending import EXIT_CODES_ENV
from tfdistx.config import userconf
from tfdistx.config.compose import hydra_run_dir
from tfdistx.rundir import EXIT_CODES
from tfdistx.core import elastic
from tfdistx.core.errors import EXIT_PORT_IN_USE, EXIT_PREEMPTED, ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.strategies import describe_jobs

DEFAULT_NOTICE = (
    120  # seconds, the least notice: more when the checkpoint's expected save needs it (cluster.preemption_grace)
)
MOST_NOTICE = 65535  # sbatch --signal's @sig_time is a 16-bit count of seconds
MOST_COUNT = 65535  # --gpus, --cpus-per-task: far above any node's, a bound on typing errors
# The run dir, fixed for the job: a requeued job keeps its id, and resumes there (shell text: $SLURM_JOB_ID is the
# job's)
RUN_DIR = "outputs/slurm/${SLURM_JOB_ID}"
# Slurm's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", re.ASCII)
TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (Slurm's --time)"
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(?:,[A-Za-z0-9_.-]+)*")
_MEMORY = re.compile(r"\d+[KMGTkmgt]?", re.ASCII)  # Slurm's --mem: megabytes, or a count with its unit
# cluster.launch values under which the tasks take their place from the Slurm step (launch/slurm/__init__.py)
_PLACED_BY_SLURM = (LaunchMode.AUTO, LaunchMode.SLURM)
# `--gpus` without a count: as many as the workers of a node use (cluster.devices_per_worker each, as a pod's --gpus)
GPUS_AS_THE_WORKERS_USE = "workers"


def notice_for(grace: float) -> int:
    """The script's --signal lead: the grace a preemption gives the run (cluster.preemption_grace: the user's, or
    derived from the checkpoint's expected save, core/checkpoint_size.py), at least DEFAULT_NOTICE."""
    return min(MOST_NOTICE, max(DEFAULT_NOTICE, math.ceil(grace)))


def main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="tfdistx job slurm",
        description="Print a Slurm batch script that runs `python -m tfdistx OVERRIDES` as one srun step, "
        "one Slurm task per TensorFlow task; Slurm's time-limit notice and a preemption checkpoint the run, and "
        "the job requeues itself to resume it. For fixed-size runs. sbatch it. See docs/clusters.md.",
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
    parser.add_argument(
        "--gpus",
        nargs="?",
        const=GPUS_AS_THE_WORKERS_USE,
        metavar="N",
        help="GPUs per node (--gpus-per-node). Without N: as many as the node's workers use, "
        "cluster.devices_per_worker (or 1) each; each worker takes its own, the other tasks none",
    )
    parser.add_argument("--cpus-per-task", help="CPUs for each Slurm task (default: the partition's)")
    parser.add_argument(
        "--mem", help="memory per node, Slurm's --mem: MB, or with a unit, 64G (default: the partition's)"
    )
    parser.add_argument(
        "--config-dir",
        help="your config dir (docs/own-project.md), given to the job's step by its absolute path: "
        "every node must hold it there (repeatable)",
    )
    parser.add_argument("--out", help="write the script to this new file (never replacing one) instead of printing it")
    config_path = os.environ.get(userconf.ENV) or None  # as the user set it, for the job's environment
    with one_line_errors():
        rest, given_dirs = userconf.split_flags(argv)
        args = parser.parse_intermixed_args(rest)
        config_dirs = [str(Path(d).expanduser().resolve()) for d in given_dirs]  # the job may start elsewhere
        userconf.add([Path(d) for d in config_dirs])  # this command composes with them too
        notice = _positive("--notice", args.notice, MOST_NOTICE, "seconds") if args.notice is not None else None
        limit = _seconds(args.time) if args.time is not None else None
        if limit and notice and notice >= limit:
            raise ConfigError.for_key(
                "--notice",
                args.notice,
                f"must be shorter than --time={args.time} ({limit} s): the notice "
                "comes that many seconds before the limit",
            )
        if args.partition is not None and not _PARTITION.fullmatch(args.partition):
            raise ConfigError.for_key(
                "--partition", args.partition, "a Slurm partition name (letters, digits, _ . -; several: a,b)"
            )
        cpus = (
            _positive("--cpus-per-task", args.cpus_per_task, MOST_COUNT, "CPUs")
            if args.cpus_per_task is not None
            else None
        )
        if args.mem is not None and not _MEMORY.fullmatch(args.mem):
            raise ConfigError.for_key(
                "--mem", args.mem, "Slurm's --mem: megabytes, or a whole number with K, M, G or T (64G); 0: all"
            )
        overrides = elastic.expand_shorthand(args.overrides)
        given = {override.lstrip("+").partition("=")[0] for override in overrides}
        # Under agents the script names the rendezvous (a node of the allocation), unless the overrides do:
        # checked here with a stand-in, as a run would check the one the script gives.
        stand_in = [] if "cluster.agent.store" in given else ["cluster.agent.store=first-node:1"]

        def launch_of(layout) -> Optional[LaunchMode]:  # the step's cluster.launch, as script() adds it
            if layout.cluster.launch not in (*_PLACED_BY_SLURM, LaunchMode.AGENT):
                raise ConfigError.for_key(
                    "cluster.launch",
                    layout.cluster.launch,
                    "the script's tasks are placed by the Slurm step: "
                    f"{', '.join(_PLACED_BY_SLURM)}, or {LaunchMode.AGENT} (an agent on every node)",
                )
            return None if layout.cluster.launch == LaunchMode.AGENT or "cluster.launch" in given else LaunchMode.SLURM

        cfg, layout = compose_as_placed([*overrides, *stand_in], launch_of, LaunchMode.SLURM)
        agents = layout.cluster.launch == LaunchMode.AGENT
        if agents and args.nodes:
            raise ConfigError.for_key(
                "--nodes",
                args.nodes,
                "with cluster.launch=agent there is one agent per node, and the nodes are "
                f"cluster.workers={_node_range(layout.cluster)}: leave --nodes out",
            )
        if notice is None:  # the grace a preemption gives the run (the user's, or derived from its save): the lead
            notice = notice_for(layout.cluster.preemption_grace)
            if limit and notice >= limit:
                raise ConfigError.for_key(
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
        gpus = _gpus(args.gpus, layout, tasks, nodes, agents) if args.gpus is not None else None
        run_dir = hydra_run_dir(cfg) if "hydra.run.dir" in given else None  # as composed: Hydra's quotes gone
        job = (
            _agents(layout.cluster, layout.servers_beside_the_keeper(), given)
            if agents
            else _tasks(tasks, nodes, layout.cluster.base_port, gpus)
        )
        asked = [
            *([f"--gpus-per-node={gpus.per_node}"] if gpus else []),
            *([f"--cpus-per-task={cpus}"] if cpus else []),
            *([f"--mem={args.mem}"] if args.mem is not None else []),
        ]
        options = BatchOptions(
            tuple(argv),
            tuple(overrides),
            args.time,
            notice,
            args.partition,
            config_path,
            run_dir,
            asked=tuple(asked),
            config_dirs=tuple(config_dirs),
        )
        text = script(job, options)
        if args.out:
            _write_new(args.out, text)
    carried = userconf.carried(config_dirs, config_path)
    if carried:  # this machine's directories: the nodes read theirs
        print(
            f"tfdistx: WARNING: the job's tasks compose with {' and '.join(carried)}: every node must hold each of "
            "these directories at that path (a shared file system), relative ones under the directory you sbatch from",
            file=sys.stderr,
        )
    if args.out:
        print(f"tfdistx: wrote {args.out}: sbatch {shlex.quote(args.out)}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


@dataclass(frozen=True)
class _Gpus:
    """What `--gpus` asks: GPUs per node, and how many each worker takes of its node's."""

    per_node: int
    per_worker: int


def _gpus(asked: str, layout, tasks, nodes: int, agents: bool) -> _Gpus:
    """--gpus [N]: a worker uses cluster.devices_per_worker GPUs (1 when null, as a pod's --gpus asks); a node holds
    as many workers as its share of the step (--ntasks-per-node caps it: _tasks), or one under agents."""
    per_worker = int(layout.cluster.devices_per_worker or 1)
    workers = tasks.get("worker", 0)
    most = 1 if agents else min(workers, math.ceil(sum(tasks.values()) / nodes))
    need = per_worker * most
    if asked == GPUS_AS_THE_WORKERS_USE:
        return _Gpus(need, per_worker)
    per_node = _positive("--gpus", asked, MOST_COUNT, "GPUs per node")
    if per_node < need:
        raise ConfigError.for_key(
            "--gpus",
            asked,
            f"a node holds up to {most} worker(s), each taking {per_worker} GPU(s) (cluster.devices_per_worker): "
            f"at least {need}, or --gpus without a count",
        )
    return _Gpus(per_node, per_worker)


class _Job:
    """What differs between a step of one Slurm task per TensorFlow task and
    a step of one agent per node: the script's words, its sbatch options,
    its srun, what it adds to the command, its environment, what it does
    before and after the step."""

    def __init__(
        self,
        kind: str,
        about: List[str],
        sbatch: List[str],
        srun: str,
        added: List[str],
        setup: List[str],
        ended: List[str],
        env: Sequence[tuple] = (),  # (variable, value, why) for the step's environment
    ):
        self.kind, self.about, self.sbatch, self.srun, self.added, self.setup, self.ended, self.env = (
            kind,
            about,
            sbatch,
            srun,
            added,
            setup,
            ended,
            list(env),
        )


def _tasks(tasks, nodes: int, base_port: int, gpus: Optional[_Gpus] = None) -> _Job:
    ntasks = sum(tasks.values())
    ranks = ", ".join(f"{job}:{index}" for job, n in tasks.items() for index in range(n))
    # --gpus: at most this many tasks a node, so that the GPUs asked per node cover its workers
    spread = [f"--ntasks-per-node={math.ceil(ntasks / nodes)}"] if gpus and nodes > 1 else []
    # Each node's tasks listen on ports its OS has free as the job starts (launch/slurm/free_ports.py), asked by a
    # step of one task a node; a derived port could be another job's on a shared node, on every try of the job.
    probe = [
        "srun",
        '--nodes="$SLURM_JOB_NUM_NODES"',
        '--ntasks="$SLURM_JOB_NUM_NODES"',
        "--ntasks-per-node=1",
        "python",
        "-m",
        free_ports.__name__,
        str(base_port),
        str(ntasks),
    ]
    setup = [
        f"# the tasks' ports: free on each node now, from cluster.base_port={base_port} + 64 x (job id mod 500) up",
        f'ports="$({" ".join(probe)})" || exit',
        f'export {SLURM_PORTS_ENV}="$ports"',
        # each task's exit code, a file per rank (commands/ending.py), this try's: srun's own code is the largest
        f'codes="${{run_dir}}/{EXIT_CODES}"  # each task\'s exit code, a file per rank',
        'rm -rf "$codes" && mkdir -p "$codes" || exit',
        f'export {EXIT_CODES_ENV}="$codes"',
    ]
    # One task's failure ends the step (--kill-on-bad-exit): srun stops the others, which checkpoint and exit 42 as
    # on a preemption, and reports the largest code. Unless a notice came, the job's code is the one of the task that
    # failed first (a full disk stays 3, and is not requeued as a preemption for ever).
    ended = [
        'if [ -z "$noticed" ]; then  # no notice came: a task\'s own end stopped the step',
        '    for rank in $(ls -tr "$codes"); do  # the ranks, in the order their tasks ended',
        '        read -r first < "${codes}/${rank}" || continue',
        f'        if [ "$first" != 0 ] && [ "$first" != {EXIT_PREEMPTED} ]; then',
        '            [ "$first" = "$code" ] || echo "tfdistx: the step\'s task ${rank} ended first, '
        'with exit code ${first}; srun stopped the others: the job ends with ${first}" >&2',
        '            code="$first"',
        "            break",
        "        fi",
        "    done",
        "fi",
    ]
    env = (
        [
            (
                GPUS_PER_WORKER_ENV,
                str(gpus.per_worker),
                f"each worker task takes its own {gpus.per_worker} of its node's GPUs",
            )
        ]
        if gpus
        else []
    )
    return _Job(
        "A fixed-size run (docs/clusters.md).",
        [
            emit.comment(
                f"{describe_jobs(tasks)}: {ntasks} Slurm task(s), one per TensorFlow task, in rank order: {ranks}"
            )
        ],
        [f"--nodes={nodes}", f"--ntasks={ntasks}", *spread],
        "srun --kill-on-bad-exit=1",
        [f"cluster.launch={LaunchMode.SLURM}"],
        setup,
        ended,
        env,
    )


def _node_range(cluster) -> str:
    low = cluster.rounds.min  # agents: their rounds, elastic or fixed
    return f"{low}:{cluster.workers}" if low != cluster.workers else str(cluster.workers)


# summary.json's file (a new one each time it is written whole: whole_files.py) and time: the step wrote it if they
# changed
_SUMMARY_STATE = "stat -c '%i %y' \"${run_dir}/summary.json\" 2>/dev/null"


def _agents(cluster, servers, given) -> _Job:
    """An agent on each node: `--nodes=MIN-MAX`, one task a node; the rendezvous
    on the node this script runs on, the allocation's first (cluster.agent.store,
    unless given), at a port free there now."""
    low = cluster.rounds.min  # agents: their rounds, elastic or fixed
    nodes = f"{low}-{cluster.workers}" if low != cluster.workers else str(cluster.workers)
    setup, added = [], []
    if "cluster.agent.store" not in given:
        setup = [
            f'store="$(python -m {free_ports.__name__} --address {cluster.base_port})" || exit  '
            "# the rendezvous, on this node (the allocation's first), whose agent keeps it"
        ]
        added = ['"cluster.agent.store=${store}"']
    if "cluster.agent.token_file" not in given:
        setup += _secret_lines()
        added.append('"cluster.agent.token_file=${token_file}"')
    setup.append(f'summary="$({_SUMMARY_STATE})"  # a summary.json of an earlier run, if any')
    servers = f" (the first node's also {describe_jobs(servers)})" if servers else ""
    about = [
        emit.comment(
            f"an agent on every node (cluster.launch=agent): {nodes} node(s), one Slurm task each, each starting its "
            f"node's worker{servers};"
        ),
        "# --no-kill: a failed node leaves the job, and the agents go on without it while "
        "cluster.elastic.min_workers remain",
    ]
    # A lost node's agent may end the step with its own code after the others trained to the end: a summary.json
    # written by this step says they did (not one an earlier run left, which a failure of this one would not change).
    ended = [
        f'written="$({_SUMMARY_STATE})"',
        f'if [ "$code" -ne {EXIT_PREEMPTED} ] && [ -n "$written" ] && [ "$written" != "$summary" ]; then',
        "    code=0  # trained to the end: this step wrote summary.json (a lost node's agent may have ended otherwise)",
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


def _secret_lines() -> List[str]:
    """The run's secret, which every agent's beat proves (launch/agent/run_secret.py): made by the batch shell, once
    per job, in the shared run dir (mode 0600, written whole, then renamed into place), before any agent starts;
    a requeued job keeps it."""
    return [
        f"token_file=\"${{run_dir}}/{run_secret.SECRET_FILE}\"  # the run's secret: every agent's beat proves it",
        'if [ ! -s "$token_file" ]; then',
        '    mkdir -p "$(dirname "$token_file")"',
        f"    (umask 077 && od -An -vtx1 -N{run_secret.SECRET_BYTES} /dev/urandom | tr -d ' \\n' "
        '> "${token_file}.new" && mv -f "${token_file}.new" "$token_file")',
        "fi",
    ]


@dataclass(frozen=True)
class BatchOptions:
    """What the user says of the batch script (`tfdistx job slurm`'s options), beside the step's tasks (_Job, made
    from the Layout), as the Kubernetes manifests take a PodOptions."""

    argv: Tuple[str, ...]  # the command line, said in the script's first comment
    overrides: Tuple[str, ...]  # the run's, as every task composes them
    time: Optional[str]  # sbatch --time
    notice: int  # seconds before the time limit that USR1 comes
    partition: Optional[str]
    config_path: Optional[str]  # TFDISTX_CONFIG_PATH, as the user set it
    run_dir: Optional[str] = None  # the run dir the overrides set; None: one fixed for the job, RUN_DIR
    asked: Tuple[str, ...] = ()  # sbatch's resource options (--gpus-per-node, --cpus-per-task, --mem)
    config_dirs: Tuple[str, ...] = ()  # the step's --config-dir, each as given


def script(job: _Job, options: BatchOptions) -> str:
    """The batch script's text; every value in it a quoted shell word (emit.py)."""
    overrides, time, notice, partition = options.overrides, options.time, options.notice, options.partition
    config_path, run_dir, asked = options.config_path, options.run_dir, options.asked
    command = [arg for directory in options.config_dirs for arg in ("--config-dir", directory)] + list(overrides)
    given = {override.lstrip("+").partition("=")[0] for override in overrides}
    if "cluster.launch" not in given:  # not a TF_CONFIG that sbatch carried over from the submitting shell
        command += [added for added in job.added if added.startswith("cluster.launch=")]
    sbatch = [
        *job.sbatch,
        *asked,
        *([f"--time={time}"] if time else []),
        *([f"--partition={partition}"] if partition else []),
        "--requeue",
        "--open-mode=append",
        f"--signal=B:USR1@{notice}",
    ]
    lines = [
        "#!/bin/bash",
        emit.comment(emit.command_line(["tfdistx", "job", "slurm", *options.argv])),
        *job.about,
        *(f"#SBATCH {emit.shell_word(option)}" for option in sbatch),
        "",
        f"# {job.kind} Slurm sends USR1 to this shell {notice} s before the time limit, and SIGTERM on a",
        "# preemption or scancel: both are passed on to the step (srun passes them to every task), "
        "whose tasks checkpoint",
        f"# at their next loop boundary and exit {EXIT_PREEMPTED}. On {EXIT_PREEMPTED} the job requeues itself "
        "and resumes from that checkpoint in the same",
        f"# run dir, and on {EXIT_PORT_IN_USE} (a task's port was taken) it requeues to start on other ports; any "
        "other code ends the job",
        "# with it (0: trained to the end; docs/preemption.md lists the others).",
        "set -u",
    ]
    if config_path:
        lines.append(f"export {userconf.ENV}={emit.shell_word(config_path)}")
    lines += [f"export {name}={emit.shell_word(value)}  # {why}" for name, value, why in job.env]
    extra = [added for added in job.added if not added.startswith("cluster.launch=")]
    if run_dir is not None:
        run = " ".join([*(emit.shell_word(arg) for arg in command), *extra])
        lines.append(f"run_dir={emit.shell_word(run_dir)}")
    else:
        run = " ".join([*(emit.shell_word(arg) for arg in command), *extra, '"hydra.run.dir=${run_dir}"'])
        lines.append(f'run_dir="{RUN_DIR}"  # the same for a requeued job: it resumes there')
    lines += [
        "step=",
        "noticed=",
        "trap 'noticed=1; kill -USR1 \"$step\" 2>/dev/null' USR1  # Slurm's time-limit notice (--signal=B:USR1@...)",
        "trap 'noticed=1; kill -TERM \"$step\" 2>/dev/null' TERM  # a preemption, scancel",
        *job.setup,
        f"{job.srun} python -m tfdistx {run} &",
        "step=$!",
        "while :; do",
        '    wait "$step"',
        "    code=$?",
        '    kill -0 "$step" 2>/dev/null || break  # the step ended (else a signal above cut the wait short)',
        "done",
        *job.ended,
        f'if [ "$code" -eq {EXIT_PREEMPTED} ]; then',
        '    echo "tfdistx: preempted, checkpoint saved in ${run_dir}: requeueing job ${SLURM_JOB_ID} '
        'to resume it" >&2',
        '    scontrol requeue "$SLURM_JOB_ID"',
        f'elif [ "$code" -eq {EXIT_PORT_IN_USE} ]; then',
        "    echo \"tfdistx: a task's port was taken on its node: requeueing job ${SLURM_JOB_ID} "
        'to start on other ports" >&2',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def _positive(option: str, value: str, most: int, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or not 1 <= int(value) <= most:  # as given: it goes into the script
        raise ConfigError.for_key(option, value, f"a whole number from 1 to {most} ({what})")
    return int(value)


def _seconds(value: str) -> int:
    """Slurm's --time in seconds (0: no limit); a value in none of its formats is refused."""
    m = _TIME.fullmatch(value)  # as given: it goes into the script as it is
    if not m:
        raise ConfigError.for_key("--time", value, f"allowed: {TIME_FORMATS}")
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
        raise ConfigError.for_key(
            "--out", path, "already exists: tfdistx job slurm never replaces a file; give a new name"
        ) from None
    except OSError as error:
        raise ConfigError.for_key("--out", path, f"cannot be written ({error.strerror})") from None
