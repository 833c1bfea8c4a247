"""One supervisor for a local cluster's rounds: form a round, start its
tasks, watch them, and end in success, in a failure (restarted from the
budget, unless no restart can cure it), or in a change of membership (the
next round forms).

Who is in a round is a Membership policy's: fixed counts of tasks on
loopback (launch/local/launcher.py), or a worker on each listed host
(launch/local/elastic.py); a per-node agent with a rendezvous is one more
policy. The rest is the same for all, so it is here once: the restart
budget and its back-off, the exit codes never restarted, a task restarted
on its own, the end of a round (the teardown, and whose exit code is the
round's), and where the supervisor's own lines go.

The shape is torchelastic's agent: one loop over explicit states, a static
membership just another policy. No TensorFlow here, and no training code.
"""

import signal
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Dict, List, Optional

from tfdistx import boundary_marks
from tfdistx.cluster import evaluator as sidecars  # the sidecar evaluator's task
from tfdistx.cluster.launch_spec import LaunchSpec
from tfdistx.cluster.liveness import task_hosts
from tfdistx.cluster.prefork import READY_TIMEOUT_SECONDS, Prefork
from tfdistx.cluster.processes import (
    STATUS_LINE,
    ForwardingSignals,
    SaidOnce,
    Task,
    causes_first,
    shell_code,
    signal_group,
    teardown,
)
from tfdistx.sigterm import nothing_to_save
from tfdistx.core.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED, PERMANENT

QUICK_GRACE_SECONDS = (
    5  # between SIGTERM and SIGKILL when a task has died (a preemption and Ctrl-C have cluster.preemption_grace)
)
HURRIED_GRACE_SECONDS = 1  # after a second Ctrl-C (each task has it too: it stops at once), then SIGKILL
MAX_BACKOFF_SECONDS = 30  # restarts wait 1, 2, 4, ... seconds, at most this
POLL_SECONDS = 0.2
# What a restart would fail the same way (core/errors.py's PERMANENT, the
# codes a JobSet fails on too), and Ctrl-C (130): the user asked to stop.
# Any other failure is worth another try (a restart picks fresh ports too).
NEVER_RESTART = (*PERMANENT, EXIT_INTERRUPTED)


class SupervisorLines:
    """The supervisor's own lines, whichever policy runs: on the terminal
    (stderr) and in the run's log (tfdistx.log) beside its tasks' lines, so
    that the log tells the run as the terminal showed it."""

    def __init__(self, run_log: Optional[str]):
        self.run_log = run_log

    def __call__(self, text: str) -> None:
        line = f"tfdistx: {text}\n"
        STATUS_LINE.above(lambda: (sys.stderr.write(line), sys.stderr.flush()))  # above the chief's status line
        if self.run_log:
            with open(self.run_log, "a") as log:
                log.write(line)


class Budget:
    """cluster.max_restarts: shared by restarts of a whole round and of a task alone."""

    def __init__(self, total: int):
        self.total, self.used = total, 0

    def take(self) -> bool:
        if self.used >= self.total:
            return False
        self.used += 1
        return True


class State(Enum):
    """How a round ended, which decides what the supervisor does next."""

    SUCCEEDED = "succeeded"  # every primary task exited 0: the run is done
    FAILED = "failed"  # a task failed with the membership unchanged: the same round again, from the restart budget
    MEMBERSHIP_CHANGED = (
        "membership changed"  # a member lost or a host asking to join: the next round forms, no restart spent
    )
    STOPPED = "stopped"  # a signal from outside: the run ends


@dataclass
class RoundResult:
    state: State
    code: int = 0  # the round's exit code, as a shell would say it
    lost: Dict[str, str] = field(default_factory=dict)  # the members lost, task -> host
    joined: List[str] = field(default_factory=list)  # the hosts asking to join
    # The trainers were told to checkpoint and stop (exit 42): they get the preemption grace, and each must leave so.
    asked_to_checkpoint: bool = False
    # The members lost went silent (a node the agents' rendezvous stopped hearing), not seen to end: their processes
    # may live on behind a cut link, and a call that waits on them fails only at TensorFlow's heartbeat timeout.
    silent: bool = False


class NoRound(Exception):
    """No round could form (too few hosts, or a signal while waiting): the run ends with `code`."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Round:
    """One membership's tasks, from their start to their teardown."""

    def __init__(self, tasks: List[Task], hosts: Dict[str, str]):
        self.tasks, self.hosts = tasks, hosts  # hosts: task name -> the host it runs on (sidecars have none)
        self.dropped: Dict[str, str] = {}  # parameter servers: workers lost while the coordinator goes on
        self.lost: Dict[str, str] = {}  # members lost in this round, which the next one forms without

    @classmethod
    def placed(cls, spec: LaunchSpec, cluster: Dict[str, List[str]], sidecar_jobs: Dict[str, int]) -> "Round":
        """A task for each address of `cluster` (job -> ["host:port", ...]),
        each told its place by TF_CONFIG, and the sidecars beside them: they
        get the cluster's TF_CONFIG with their own task type, and no address in it."""
        refusals = SaidOnce()  # every task refuses a bad config alike: its line is shown once
        jobs = {**{job: len(addresses) for job, addresses in cluster.items()}, **sidecar_jobs}
        tasks = [
            Task(
                job,
                index,
                cluster,
                list(spec.command),
                Path(spec.log_dir),
                spec.run_log,
                refusals,
                dict(spec.task_env),
            )
            for job, n in jobs.items()
            for index in range(n)
        ]
        hosts = task_hosts(cluster)
        return cls(tasks, hosts)

    def members(self) -> Dict[str, str]:
        """The round's live members, task -> host."""
        return {name: host for name, host in self.hosts.items() if name not in self.dropped}

    def restart(self, task: Task, signals: ForwardingSignals, prefork: Optional[Prefork] = None) -> None:
        task.start(prefork)
        signals.procs = [t.proc for t in self.tasks]

    def ask_to_checkpoint(self) -> None:
        """The preemption path: the trainers save at their next loop boundary and exit 42."""
        for task in self.tasks:
            if task.proc.poll() is None:
                signal_group(task.proc, signal.SIGTERM)


class Membership:
    """Who is in each round: a policy of the supervisor's. The defaults are a
    membership that never changes."""

    def form(self, reason: str, signals: ForwardingSignals) -> Round:
        """The next round, its tasks not started yet, formed for `reason`;
        raises NoRound when none can form."""
        raise NotImplementedError

    def check(self, round_: Round, signals: ForwardingSignals) -> Optional[RoundResult]:
        """At each poll of a running round: the change of membership that ends it, if any."""
        return None

    def goes_on_without(self, round_: Round, task: Task) -> bool:
        """A task restarted alone has failed: True if the round goes on without it (its host is gone)."""
        return False

    def failed(self, round_: Round, task: Task, code: int) -> RoundResult:
        """`task` failed with `code` and cannot be restarted alone: how the round ends."""
        return RoundResult(State.FAILED, code)

    def regroup(self, result: RoundResult, signals: ForwardingSignals) -> str:
        """After a change of membership: why the next round forms."""
        raise NotImplementedError


class Supervisor:
    """The loop over rounds, for `spec` (the local launcher's, or a node's
    agent's) and a membership policy; `signals` from outside are passed on to the
    tasks; `prefork`, if given, forks them (cluster/prefork.py)."""

    def __init__(
        self,
        spec: LaunchSpec,
        membership: Membership,
        signals: ForwardingSignals,
        say: SupervisorLines,
        prefork: Optional[Prefork] = None,
    ):
        self.membership, self.signals, self.say, self.prefork = membership, signals, say, prefork
        self.restarts = Budget(spec.max_restarts)
        self.primary, self.alone = spec.primary, spec.restart_alone
        self.stopped_limit = spec.stopped_task_timeout
        self.preemption_grace = spec.preemption_grace
        self.peer_timeout = spec.peer_timeout
        self.rounds: List[Round] = []  # those whose tasks started

    def run(self) -> int:
        """The run's exit code: 0 once the training is done, else the code it stopped with. Stopped by
        Ctrl-C (130), the run's one line is said here, unless a trainer said it with the step it saved."""
        code = self._rounds()
        said = any(t.refusals.interrupted for r in self.rounds for t in r.tasks)
        if code == EXIT_INTERRUPTED and self.signals.ctrl_c and not said:
            self.say("interrupted")
        return code

    def _rounds(self) -> int:
        reason = "started"
        while True:
            try:
                round_ = self.membership.form(reason, self.signals)
            except NoRound as none:
                return self._between_rounds() if self.signals.received else none.code
            if self.signals.received:  # came as the round formed: none of its tasks started
                return self._between_rounds()
            result = self._run_round(round_)
            if (
                result.state in (State.SUCCEEDED, State.STOPPED)
                or self.signals.received
                or result.code in NEVER_RESTART
            ):
                return result.code
            if result.state is State.FAILED:
                if not self.restarts.take():
                    if self.restarts.total:
                        self.say(
                            f"giving up: the cluster stopped after {self.restarts.total} restart(s) "
                            f"(cluster.max_restarts={self.restarts.total}); last exit code {result.code}"
                        )
                    return result.code
                used, total = self.restarts.used, self.restarts.total
                delay = min(2 ** (used - 1), MAX_BACKOFF_SECONDS)
                self.say(
                    f"the cluster stopped with exit code {result.code}; restart {used} of {total} in {delay}s, "
                    "resuming from the latest checkpoint"
                )
                if self.signals.wait(delay):  # a signal during the back-off ends it
                    return self._between_rounds()
                reason = f"restart {used} of {total} after exit code {result.code}"
            else:
                reason = self.membership.regroup(result, self.signals)
            if self.signals.received:
                return self._between_rounds()

    def _between_rounds(self) -> int:
        """A signal while no task runs (the cluster starting, a back-off, the
        wait for a lost host, a round forming): Ctrl-C is 130; a SIGTERM (or
        SIGHUP) is a preemption with nothing to save (the last round's tasks
        have ended, the next one's have not started), said so: exit 42, and a
        rerun resumes from the newest checkpoint."""
        received = self.signals.received[0]
        if received == signal.SIGINT:
            return EXIT_INTERRUPTED
        name = signal.Signals(received).name
        if not self.rounds:  # as the launcher says it, had the signal come a moment before
            self.say(nothing_to_save(name, "before the cluster started"))
            return EXIT_PREEMPTED
        self.say(
            f"preempted ({name}) between rounds: no task of the next round had started, so there was nothing to save; "
            f"exit {EXIT_PREEMPTED}: rerun the same command to resume from the newest checkpoint"
        )
        return EXIT_PREEMPTED

    def _run_round(self, round_: Round) -> RoundResult:
        self._until_the_prefork_is_ready()
        for task in round_.tasks:
            if self.signals.received:  # came as the round started: the tasks started have it, no other starts
                break
            task.start(self.prefork)
            # From here a signal reaches it; one that came before it joined is given to it now (ForwardingSignals).
            self.signals.procs = [t.proc for t in round_.tasks if t.proc is not None]
        round_.tasks = [task for task in round_.tasks if task.proc is not None]
        if not round_.tasks:  # the signal came before any started
            return RoundResult(State.STOPPED, self._between_rounds())
        self.rounds.append(round_)
        return self._end(round_, self._watch(round_))

    def _until_the_prefork_is_ready(self) -> None:
        """The prefork's imports (seconds, fresh): waited for in slices, so that a signal meanwhile starts no task."""
        if self.prefork is None:
            return
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.prefork.wait_ready(POLL_SECONDS) and not self.signals.received:
            if time.monotonic() >= deadline:
                return  # spawn says it cannot: the tasks start as fresh processes

    def _watch(self, round_: Round) -> RoundResult:
        """Until the primary tasks have all exited 0, a task failed that
        cannot be restarted alone, the membership changed, or a signal came
        (already passed on to the tasks).

        A task that stays stopped (SIGSTOP, a debugger) `stopped_limit`
        seconds is killed, so that it counts as lost: a parameter-server
        coordinator would otherwise wait on its step forever (TensorFlow
        notices a dead worker, not a frozen one), and a synchronous cluster
        is restarted without waiting on it.
        """
        sidecars_ended = set()
        while not self.signals.received:
            changed = self.membership.check(round_, self.signals)
            if changed:
                return changed
            for task in round_.tasks:
                if task.stopped_for() > self.stopped_limit:
                    self.say(
                        f"task {task.name} has been stopped for more than {self.stopped_limit:g}s "
                        "(cluster.stopped_task_timeout): treating it as lost"
                    )
                    signal_group(task.proc, signal.SIGKILL)
                    task.proc.wait()
            for task in round_.tasks:  # never restarted, never stop the cluster: said once if they failed
                code = task.proc.poll()
                if sidecars.is_sidecar(task.job) and code is not None and task.name not in sidecars_ended:
                    sidecars_ended.add(task.name)
                    if code != 0:
                        sidecars.report_exit(task.name, shell_code(code), self.say)
            trainers = [t for t in round_.tasks if not sidecars.is_sidecar(t.job) and t.name not in round_.dropped]
            for task in causes_first(trainers):
                code = task.proc.poll()
                if code in (None, 0):
                    continue
                if task.job in self.alone and code not in NEVER_RESTART:
                    if self.membership.goes_on_without(round_, task):
                        continue
                    if self.restarts.take():
                        self.say(
                            f"task {task.name} exited with code {shell_code(code)}; restarting it alone "
                            f"(restart {self.restarts.used} of {self.restarts.total})"
                        )
                        round_.restart(task, self.signals, self.prefork)
                        continue
                result = self.membership.failed(round_, task, shell_code(code))
                if result.state is State.FAILED:
                    self.say(f"task {task.name} exited with code {shell_code(code)}; stopping the cluster")
                return result
            if all(task.proc.poll() == 0 for task in round_.tasks if task.job in self.primary):
                return RoundResult(State.SUCCEEDED)
            time.sleep(POLL_SECONDS)
        return RoundResult(State.STOPPED)

    def _let_the_chief_save(self, round_: Round, result: RoundResult) -> None:
        """A synchronous round lost a member, or a task failed: a chief that
        holds the last loop boundary's state (engine/commit.py, marked:
        boundary_marks.py) saves it before it leaves, once its call fails,
        so that the loss costs at most one loop. Stopped with the round, as
        it was, it saved nothing when its call had not failed within the
        teardown's second (a slow step, a busy machine): the restart then
        trained again every step since the newest checkpoint.

        So it is waited for first. Its call fails at once when the peer's
        process is gone (its connections close), at the latest at
        TensorFlow's heartbeat timeout, `cluster.peer_timeout`: that long
        for the call to fail, and once it saves (marked), the preemption's
        `cluster.preemption_grace` for the save. A member lost by going
        silent (a node behind a cut link: result.silent) may hold the call
        up to the heartbeat timeout, which the round does not wait for:
        only a chief already saving is. A signal from outside ends the wait."""
        holding = [
            t for t in round_.tasks if t.proc.poll() is None and boundary_marks.marked(t.scratch, boundary_marks.HOLDS)
        ]
        if not holding:
            return
        started, saving_since = time.monotonic(), None
        while not self.signals.received:
            running = [t for t in holding if t.proc.poll() is None]
            if not running:
                return
            now = time.monotonic()
            if saving_since is None and any(boundary_marks.marked(t.scratch, boundary_marks.SAVING) for t in running):
                saving_since = now
            if saving_since is not None:
                waited, bound, key = now - saving_since, self.preemption_grace, "cluster.preemption_grace"
                doing = "saving the last loop boundary"
            elif result.silent:
                return
            else:
                waited, bound, key = now - started, self.peer_timeout, "cluster.peer_timeout"
                doing = "noticing the lost peer"
            if waited >= bound:
                self.say(
                    f"{', '.join(t.name for t in running)} still {doing} after {bound:g}s ({key}): "
                    "stopping it with the round"
                )
                return
            time.sleep(POLL_SECONDS)

    def _end(self, round_: Round, result: RoundResult) -> RoundResult:
        """Stop every task of the round; the result, with the tasks' own verdict after a signal."""
        signals = self.signals
        if result.state is State.SUCCEEDED and not signals.received:  # the evaluator evaluates the final checkpoint
            sidecars.let_finish(
                [t.proc for t in round_.tasks if sidecars.is_sidecar(t.job)], lambda: bool(signals.received), self.say
            )
        if result.state is State.SUCCEEDED and not signals.received:
            for task in round_.tasks:
                task.succeeded.set()
        # A signal from outside (a SIGTERM; Ctrl-C, which trainers in their
        # loop save on too), or the supervisor's own request, leaves the
        # tasks time to checkpoint; a second Ctrl-C cuts it short. Once a task has died (its
        # peers, blocked in a collective, can neither checkpoint nor leave but
        # by SIGKILL), there is nothing to wait for; a synchronous round that
        # lost a member, or whose task failed (any code but 42: its peers are
        # blocked in a collective or in forming the cluster), has nothing to
        # save: a checkpoint needs every worker. They get the teardown's
        # moment to leave on their own, not a grace they cannot use.
        preempted = bool(signals.received) or result.asked_to_checkpoint
        broken = result.lost or (result.state is State.FAILED and result.code != EXIT_PREEMPTED)
        if broken and not preempted and not signals.received:
            self._let_the_chief_save(round_, result)
        grace = self.preemption_grace if preempted else 0 if broken and not self.alone else QUICK_GRACE_SECONDS
        teardown(
            round_.tasks,
            self.primary,
            grace=grace,
            signalled=bool(signals.received) or result.asked_to_checkpoint,
            hurry=lambda: None if signals.hurried_at is None else signals.hurried_at + HURRIED_GRACE_SECONDS,
        )
        trainers = [t for t in round_.tasks if t.job in self.primary]
        trainers_done = bool(trainers) and all(t.proc.returncode == 0 for t in trainers)
        if signals.ctrl_c:  # the user's stop, whatever the tasks made of it (a peer gone first, a task killed)
            result = RoundResult(State.STOPPED, EXIT_INTERRUPTED)
        elif signals.received and trainers_done:  # a notice after the last loop boundary: the run finished (sigterm.py)
            result = RoundResult(State.SUCCEEDED)
        elif signals.received:  # the tasks' own verdict if they gave one (42: checkpointed), else 128 + signal
            own = [
                t.proc.returncode
                for t in round_.tasks
                if t.proc.returncode not in (0, -signal.SIGKILL) and not sidecars.is_sidecar(t.job)
            ]
            result = RoundResult(State.STOPPED, shell_code(own[0] if own else -signals.received[0]))
            if own and set(own) <= {EXIT_PREEMPTED, -signal.SIGTERM}:
                # A task the SIGTERM ended was still starting (a task takes the signal over from its start, sigterm.py):
                # it had trained nothing. Those that had started checkpointed (42); if none had, there was nothing to
                # save.
                if EXIT_PREEMPTED not in own:
                    self.say(
                        "preempted (SIGTERM) as the round's tasks were starting: none had begun training, so there "
                        f"was nothing to save; exit {EXIT_PREEMPTED}: rerun the same command to resume from the "
                        "newest checkpoint"
                    )
                result = RoundResult(State.STOPPED, EXIT_PREEMPTED)
        elif result.asked_to_checkpoint:  # a trainer that did not checkpoint and leave as asked: a failure
            refused = [t for t in round_.tasks if t.job in self.primary and t.proc.returncode != EXIT_PREEMPTED]
            if refused:
                result = RoundResult(State.FAILED, shell_code(refused[0].proc.returncode))
        for task in round_.tasks:
            for thread in task.pumps:
                thread.join(timeout=5)
        return result
