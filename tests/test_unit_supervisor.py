"""The one supervisor loop (cluster/supervisor.py), in-process, over tasks
that are real child processes exiting with a chosen code: what a failure,
a permanent code and a change of membership lead to, whichever policy
forms the rounds, and where the supervisor's own lines go. Also that the
codes no restart cures are one list, core/errors.py's, for the local
launcher, a JobSet and a TFJob alike."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tfdistx.cluster.launch_spec import LaunchSpec
from tfdistx.launch.local.launcher import FixedCounts
from tfdistx.cluster.processes import ForwardingSignals
from tfdistx.cluster.supervisor import NEVER_RESTART, Membership, Round, RoundResult, SupervisorLines, State, Supervisor
from tfdistx.core.errors import PERMANENT, RETRYABLE, RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES, offset_exit

pytestmark = pytest.mark.unit


def spec_of(tmp_path, code: int, max_restarts: int = 0, command=None, **more) -> LaunchSpec:
    """Two workers that exit with `code` (or run `command`), as the local launcher hands them to its supervisor."""
    return LaunchSpec(
        command=tuple(command or [sys.executable, "-c", f"import sys; sys.exit({code})"]),
        log_dir=str(tmp_path),
        run_log=str(tmp_path / "tfdistx.log"),
        primary=("worker",),
        max_restarts=max_restarts,
        counts={"worker": 2},
        **more,
    )


def supervise(spec: LaunchSpec, membership: Membership) -> int:
    with ForwardingSignals([]) as signals:
        return Supervisor(spec, membership, signals, SupervisorLines(spec.run_log)).run()


def test_a_failed_round_is_restarted_from_the_budget_then_given_up_on(tmp_path, capsys):
    spec = spec_of(tmp_path, 5, max_restarts=1)
    assert supervise(spec, FixedCounts(spec)) == 5
    said = capsys.readouterr().err
    assert (
        "restart 1 of 1 in 1s" in said
        and "giving up: the cluster stopped after 1 restart(s) (cluster.max_restarts=1)" in said
    )
    assert said.count("exited with code 5; stopping the cluster") == 2
    assert (
        said in (tmp_path / "tfdistx.log").read_text()
    )  # the supervisor's lines: the terminal's and the run's log's alike


def test_a_permanent_exit_code_is_never_restarted_and_success_is_zero(tmp_path, capsys):
    spec = spec_of(tmp_path, 2, max_restarts=3)
    assert supervise(spec, FixedCounts(spec)) == 2 and "restart" not in capsys.readouterr().err
    spec = spec_of(tmp_path, 0)
    assert supervise(spec, FixedCounts(spec)) == 0


class Regrouping(FixedCounts):
    """A policy of its own: the first round's failure is a lost member, and the next round forms for it, no restart
    spent."""

    def __init__(self, spec: LaunchSpec, then: LaunchSpec):
        super().__init__(spec)
        self.then, self.reasons = then, []

    def form(self, reason, signals) -> Round:
        self.reasons.append(reason)
        return super().form(reason, signals)

    def failed(self, round_, task, code) -> RoundResult:
        self.spec = self.then
        return RoundResult(State.MEMBERSHIP_CHANGED, code, lost={task.name: "127.0.0.2"})

    def regroup(self, result, signals) -> str:
        return ", ".join(f"lost {name}" for name in result.lost)


def test_a_change_of_membership_forms_the_next_round_without_a_restart(tmp_path, capsys):
    policy = Regrouping(spec_of(tmp_path, 5), then=spec_of(tmp_path, 0))
    assert supervise(spec_of(tmp_path, 5), policy) == 0
    assert policy.reasons[0] == "started" and policy.reasons[1] in ("lost worker:0", "lost worker:1"), policy.reasons
    assert len(policy.reasons) == 2 and "restart" not in capsys.readouterr().err


def test_the_codes_no_restart_cures_are_one_list_for_the_launcher_a_jobset_and_a_tfjob(capsys):
    from tfdistx.commands import kubernetes

    overrides = ["strategy=multiworker", "cluster=2x1", "--image", "img"]
    kubernetes.write(overrides, "jobset")
    for job in next(yaml.safe_load_all(capsys.readouterr().out))["spec"]["replicatedJobs"]:
        assert job["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == list(PERMANENT)
    assert set(PERMANENT) <= set(NEVER_RESTART) and not set(PERMANENT) & set(RETRYABLE)
    # a TFJob's restartPolicy ExitCode retries 128-255 only: its pods move the retryable codes above 127, the permanent
    # ones stay below
    kubernetes.write(overrides, "tfjob")
    worker = yaml.safe_load(capsys.readouterr().out)["spec"]["tfReplicaSpecs"]["Worker"]
    assert (
        f"cluster.retryable_exit_offset={RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES}"
        in worker["template"]["spec"]["containers"][0]["args"]
    )
    assert all(offset_exit(code, RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES) == code < 128 for code in PERMANENT)
    assert all(128 <= offset_exit(code, RETRYABLE_EXIT_OFFSET_FOR_KUBERNETES) <= 255 for code in RETRYABLE)


class SigtermAt(Regrouping):
    """A SIGTERM to this process (the supervisor's) at `when`: 'regroup', as the next round waits for a lost host to
    come back, or 'check', once the round's tasks are running (real processes that have not taken SIGTERM over)."""

    def __init__(self, spec: LaunchSpec, then: LaunchSpec, when: str):
        super().__init__(spec, then)
        self.when = when

    def regroup(self, result, signals) -> str:
        if self.when == "regroup":
            os.kill(os.getpid(), signal.SIGTERM)
        return super().regroup(result, signals)

    def check(self, round_, signals):
        if self.when == "check":
            os.kill(os.getpid(), signal.SIGTERM)
        return None


def test_a_sigterm_between_rounds_is_a_preemption_with_nothing_to_save(tmp_path, capsys):
    """Not 143, silently: exit 42, in one line saying there was nothing to save; no task of the next round starts."""
    policy = SigtermAt(spec_of(tmp_path, 5), then=spec_of(tmp_path, 0), when="regroup")
    assert supervise(spec_of(tmp_path, 5), policy) == 42
    said = capsys.readouterr().err
    assert (
        "tfdistx: preempted (SIGTERM) between rounds: no task of the next round had started, so there was nothing "
        "to save; exit 42: rerun the same command to resume from the newest checkpoint" in said
    ), said
    assert len(policy.reasons) == 1, policy.reasons


def test_a_sigterm_as_the_round_s_tasks_start_is_a_preemption_not_143(tmp_path, capsys):
    """The tasks were still starting (the signal's default ended them): none had trained, so exit 42, said so."""
    spec = spec_of(tmp_path, 0, command=[sys.executable, "-c", "import time; time.sleep(60)"], preemption_grace=30)
    policy = SigtermAt(spec, then=spec, when="check")
    assert supervise(spec, policy) == 42
    said = capsys.readouterr().err
    assert (
        "preempted (SIGTERM) as the round's tasks were starting: none had begun training, so there was nothing "
        "to save; exit 42" in said
    )


def test_the_launcher_passes_a_notice_signal_on_to_its_tasks_as_sigterm(tmp_path):
    """A USR1 to the local launcher (cluster.notice_signals) reaches each task as the SIGTERM it checkpoints on,
    and is remembered as one (the supervisor's preemption path, unchanged)."""
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time, pathlib; "
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42)); "
            f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60); sys.exit(1)",
        ]
    )
    try:
        with ForwardingSignals([child], ["USR1"]) as signals:
            deadline = time.monotonic() + 30
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGUSR1)
            assert signals.wait(5) and signals.received == [signal.SIGTERM]
            assert child.wait(timeout=30) == 42
    finally:
        child.kill()
        child.wait()


def test_a_machine_without_util_linux_unshare_is_probed_with_the_system_call_itself(tmp_path, monkeypatch):
    """can_isolate asks `unshare` where it is installed; where it is not, it makes the namespace as the supervisor will
    (enter_private_network), so a machine without util-linux is not taken for one that cannot isolate."""
    from tfdistx.cluster.processes import can_isolate

    with_the_binary = can_isolate()
    monkeypatch.setenv("PATH", str(tmp_path))  # no `unshare` on it
    assert can_isolate() == with_the_binary


# A synchronous round's two tasks: worker:1 dies (SIGKILL) once the chief, worker:0, holds the last loop boundary
# (engine/commit.py marks it: boundary_marks.py); the chief's call then takes 2 s to fail (a slow step, a busy
# machine: slower than the teardown's second), and it saves that boundary and leaves with 5, as a real chief does.
# `saving`: the chief is already saving when its peer dies.
CHIEF_AND_PEER = """
import json, os, pathlib, signal, sys, time
from tfdistx import boundary_marks
shared, saving = pathlib.Path(sys.argv[1]), sys.argv[2] == "saving"
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    while not (shared / "chief-holds").exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
boundary_marks.mark(boundary_marks.HOLDS)
if saving:
    boundary_marks.mark(boundary_marks.SAVING)
(shared / "chief-holds").touch()
time.sleep(2)
boundary_marks.mark(boundary_marks.SAVING)
(shared / "saved").touch()
sys.exit(5)
"""


class LostSilently(Regrouping):
    """The agents' verdict on a node the keeper stopped hearing: a lost member that was not seen to end."""

    def failed(self, round_, task, code) -> RoundResult:
        self.spec = self.then
        return RoundResult(State.MEMBERSHIP_CHANGED, code, lost={task.name: "10.77.0.3"}, silent=True)


@pytest.mark.parametrize(
    "policy, saving, saved",
    [
        ("the peer's process ended", "", True),
        ("the peer went silent", "", False),
        ("the peer went silent", "saving", True),
    ],
)
def test_a_chief_holding_the_last_loop_boundary_is_let_save_it_before_the_round_stops(
    tmp_path, capsys, policy, saving, saved
):
    """The round stops for a lost peer: a chief that holds the last loop boundary's state is waited for until it has
    saved it (its call fails at once on a peer whose process is gone, at the latest at cluster.peer_timeout; the save
    gets cluster.preemption_grace), so that the loss costs at most one loop. A peer that went silent (a cut link, as
    the agents' keeper tells it) holds the call up to the heartbeat timeout, which the round does not wait for: only
    a chief already saving then is."""
    spec = spec_of(tmp_path, 0, command=[sys.executable, "-c", CHIEF_AND_PEER, str(tmp_path), saving])
    membership = FixedCounts(spec) if policy == "the peer's process ended" else LostSilently(spec, spec_of(tmp_path, 0))
    code = supervise(spec, membership)
    said = capsys.readouterr().err
    assert (tmp_path / "saved").exists() == saved, said
    assert code == (137 if policy == "the peer's process ended" else 0), said
    assert "stopping it with the round" not in said, said


class SignalsOnceReady(FixedCounts):
    """`sig` to this process (the supervisor's), `times` over (each taken before the next is sent), once every
    task of the round says it is ready."""

    def __init__(self, spec: LaunchSpec, sig: int, times: int = 1):
        super().__init__(spec)
        self.sig, self.times = sig, times

    def check(self, round_, signals):
        if all((Path(self.spec.log_dir) / f"ready-{task.proc.pid}").exists() for task in round_.tasks):
            for _ in range(self.times):
                os.kill(os.getpid(), self.sig)
        return None


def ready_then(tmp_path, then: str) -> list:
    """A task's command: says it is ready (a file named by its pid), then `then`."""
    return [
        sys.executable,
        "-c",
        f"import os, pathlib, signal, sys, time; {then}; "
        f"pathlib.Path({str(tmp_path)!r}, f'ready-{{os.getpid()}}').touch(); time.sleep(600)",
    ]


def test_a_sigterm_the_tasks_finish_the_run_through_is_its_success_not_143(tmp_path, capsys):
    """A notice after the last loop boundary: the trainers finish (summary, export) and exit 0; the run did too."""
    spec = spec_of(tmp_path, 0, command=ready_then(tmp_path, "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))"))
    assert supervise(spec, SignalsOnceReady(spec, signal.SIGTERM)) == 0


@pytest.mark.timeout(300)  # without the hurry, the grace: 3000 s
def test_a_second_ctrl_c_cuts_the_grace_the_first_gives_the_trainers_to_save_short(tmp_path, capsys):
    saving_for_ever = ready_then(tmp_path, "signal.signal(signal.SIGINT, signal.SIG_IGN)")
    spec = spec_of(tmp_path, 0, command=saving_for_ever, preemption_grace=3000)
    assert supervise(spec, SignalsOnceReady(spec, signal.SIGINT, times=2)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "tfdistx: interrupted"
