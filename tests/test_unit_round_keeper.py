"""The agents' rendezvous (launch/agent/round_keeper.py): which agents form each
round, when a round closes, and every wait bounded. Its clock is the test's,
so that a bound of seconds is tested without waiting for it: each beat is
recorded, and the keeper decides on its tick (here, after every beat). Over
the network, as the agents ask it: tests/test_unit_rendezvous_wire.py."""

import json

import pytest

from tfdistx.launch.agent.messages import (
    DONE,
    ENDED,
    FAILED,
    GROW,
    LOST,
    RUNNING,
    TASK_FAILED,
    WAITING,
    Beat,
    Told,
    beat_seconds,
)
from tfdistx.launch.agent.round_keeper import RoundKeeper

pytestmark = pytest.mark.unit

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def keeper(low=2, high=3, join_grace=5, lost_bound=3, below_min_timeout=60, **more):
    clock, said = Clock(), []
    kept = RoundKeeper(
        low, high, join_grace, lost_bound, below_min_timeout, on_round=lambda *a: said.append(a), clock=clock, **more
    )
    return kept, clock, said


def beat(kept, address, status=WAITING, number=0, code=0, agent=None, known=0) -> Told:
    """A beat of the agent on `address` (named after it, unless `agent` names it), the keeper's tick, and what
    the agent hears at its next beat (from `known`, the version of the rounds it knows: 0, none)."""
    sent = Beat(agent or address, address, 7000, status, number, code, known)
    kept.beat(sent)
    kept.tick()
    return heard(kept.beat(sent))


def heard(answer: bytes) -> Told:
    """What an agent reads in the keeper's answer."""
    return Told.read(json.loads(answer))


def running(kept, clock, addresses, number):
    for address in addresses:
        beat(kept, address, RUNNING, number)


def advance(kept, clock, seconds, **beating):
    """`seconds` pass, the agents named (address -> (status, round)) beating every half second meanwhile."""
    for _ in range(int(seconds * 2)):
        clock.now += 0.5
        for address, (status, number) in beating.items():
            beat(kept, address, status, number)


def test_a_round_forms_at_once_with_max_agents_and_names_its_workers_in_order():
    kept, clock, said = keeper()
    for address in (A, B, C):
        told = beat(kept, address)
    assert told.news.number == 1 and told.news.why is None and kept.round.members == [A, B, C]
    assert told.place.workers == [f"{A}:7000", f"{B}:7000", f"{C}:7000"] and told.place.index == 2
    assert said == [(1, {"worker:0": A, "worker:1": B, "worker:2": C}, "started")]


def test_with_min_agents_a_round_waits_join_grace_for_more():
    kept, clock, said = keeper(join_grace=5)
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 4.5, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round is None
    advance(kept, clock, 1, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round.members == [A, B] and kept.round.number == 1


def test_below_min_for_its_bound_stops_the_run_with_exit_9():
    kept, clock, said = keeper(below_min_timeout=10)
    beat(kept, A)
    advance(kept, clock, 9.5, **{A: (WAITING, 0)})
    assert kept.stopped is None
    advance(kept, clock, 1, **{A: (WAITING, 0)})
    stopped = beat(kept, A).news.stopped
    assert stopped.code == 9 and "fewer than the 2 a round needs" in stopped.why and not said


def test_a_silent_member_is_lost_after_lost_bound_and_the_survivors_form_the_next_round():
    kept, clock, said = keeper(lost_bound=3, join_grace=5)
    for address in (A, B, C):
        beat(kept, address)
    advance(kept, clock, 3, **{A: (RUNNING, 1), B: (RUNNING, 1)})  # C beats no more
    assert kept.round.why is None  # 3 s: not yet past the bound
    advance(kept, clock, 0.5, **{A: (RUNNING, 1), B: (RUNNING, 1)})
    assert kept.round.why == LOST and kept.round.lost == {"worker:2": C}
    advance(kept, clock, 1, **{A: (WAITING, 0), B: (RUNNING, 1)})
    assert kept.round.number == 1  # B's tasks still run: no round until it waits too
    advance(kept, clock, 5.5, **{A: (WAITING, 0), B: (WAITING, 0)})  # join_grace: two of at most three
    assert kept.round.number == 2 and kept.round.members == [A, B] and said[-1][2] == f"lost worker:2 at {C}"


def test_a_node_asking_to_join_holds_lost_bound_and_the_round_grows():
    kept, clock, said = keeper(low=2, high=3, lost_bound=3, join_grace=5)
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 5.5, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round.members == [A, B]
    beat(kept, C)  # a node that was not there: it must hold lost_bound before the round changes for it
    advance(kept, clock, 2.5, **{A: (RUNNING, 1), B: (RUNNING, 1), C: (WAITING, 0)})
    assert kept.round.why is None
    advance(kept, clock, 1, **{A: (RUNNING, 1), B: (RUNNING, 1), C: (WAITING, 0)})
    assert kept.round.why == GROW and kept.round.joining == [C]
    advance(kept, clock, 1, **{A: (WAITING, 0), B: (WAITING, 0), C: (WAITING, 0)})  # the members checkpointed and wait
    assert kept.round.number == 2 and kept.round.members == [A, B, C] and said[-1][2] == f"{C} joined"


def test_a_flapping_node_changes_no_round():
    kept, clock, said = keeper(low=2, high=3, lost_bound=3, join_grace=5)
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 5.5, **{A: (WAITING, 0), B: (WAITING, 0)})
    for _ in range(6):  # C there for a second, away for four: never held long enough to count
        advance(kept, clock, 1, **{A: (RUNNING, 1), B: (RUNNING, 1), C: (WAITING, 0)})
        advance(kept, clock, 4, **{A: (RUNNING, 1), B: (RUNNING, 1)})
    assert kept.round.number == 1 and kept.round.why is None


def test_a_lost_node_back_before_the_next_round_forms_is_in_it_and_said_back():
    kept, clock, said = keeper(low=2, high=2, lost_bound=3)
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 4, **{A: (RUNNING, 1)})
    assert kept.round.why == LOST
    advance(kept, clock, 2, **{A: (WAITING, 0)})
    beat(kept, B)  # back: held lost_bound, then in the next round
    advance(kept, clock, 2.5, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round.number == 1
    advance(kept, clock, 1, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round.number == 2 and said[-1][2] == f"lost worker:1 at {B}, back"


def test_a_failed_task_closes_the_round_with_its_code_and_the_same_members_restart():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    beat(kept, A, FAILED, 1, code=1)
    closed = beat(kept, B, RUNNING, 1).news
    assert closed.why == TASK_FAILED and closed.code == 1
    beat(kept, A), beat(kept, B)
    assert kept.round.number == 2 and kept.round.members == [A, B] and said[-1][2] == "restart after exit code 1"


def test_an_agent_that_ended_is_lost_at_once_and_one_restarted_once_silent():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    assert beat(kept, B, ENDED, 1).news.why == LOST
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    beat(kept, B, WAITING, agent="B again")  # its agent started again: a new member; the old one is lost once silent
    advance(kept, clock, 3.5, **{A: (RUNNING, 1)})
    assert kept.round.why == LOST and kept.round.lost == {"worker:1": B}


def test_two_agents_on_one_host_are_two_members():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A, agent="first"), beat(kept, A, agent="second")
    assert kept.round.members == ["first", "second"] and said[-1][1] == {"worker:0": A, "worker:1": A}


def test_the_run_is_finished_once_every_member_is_done_and_nothing_forms_after():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    beat(kept, A, DONE, 1)
    assert not beat(kept, B, RUNNING, 1).news.finished
    assert beat(kept, B, DONE, 1).news.finished
    assert not kept.settled()  # A, done first, has not heard that B is: it would wait out its bound
    assert beat(kept, A, DONE, 1).news.finished and kept.settled()
    beat(kept, C)
    assert kept.round.number == 1


def test_under_parameter_servers_the_keepers_node_is_in_every_round_with_the_servers_and_its_end_is_the_runs():
    kept, clock, said = keeper(low=2, high=3, lost_bound=3, join_grace=5)
    kept.finisher = C  # the agent that keeps the rounds, whose node runs the chief and the ps
    kept.servers = lambda: {"chief": [f"{C}:8000"], "ps": [f"{C}:8001"]}
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 10, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round is None  # two agents, but not the chief's node: no round can run
    beat(kept, C)
    formed = beat(kept, A)
    assert kept.round.members == [C, A, B] and formed.place.servers == {"chief": [f"{C}:8000"], "ps": [f"{C}:8001"]}
    assert said[-1][1] == {"chief:0": C, "ps:0": C, "worker:0": C, "worker:1": A, "worker:2": B}
    beat(kept, C, DONE, 1)  # the chief finished: the other nodes' workers only served it
    assert beat(kept, A, RUNNING, 1).news.finished and beat(kept, B, RUNNING, 1).news.why == "done"


def test_a_rerun_counts_its_rounds_on_from_those_the_run_had():
    kept, clock, said = keeper(low=1, high=1)
    kept.numbered_after = 2  # logs/rounds.json held two: a requeued job's agents say round 3
    assert beat(kept, A).news.number == 3 and said[-1][0] == 3


def test_a_beat_is_only_recorded_the_tick_decides_and_an_agent_hears_the_round_once():
    """A beat costs the same whatever the cluster: it records and answers from what is decided; the round forms
    on the keeper's tick. An agent that knows the current version is told no news, and its place once."""
    kept, clock, said = keeper(low=3, high=3)
    for address in (A, B, C):
        kept.beat(Beat(address, address, 7000, WAITING))
    assert kept.round is None and not said  # three beats, no decision yet
    kept.tick()
    assert kept.round.members == [A, B, C]
    told = heard(kept.beat(Beat(B, B, 7000, WAITING)))
    assert (told.news.number, told.place.index, told.place.number) == (1, 1, 1)
    again = heard(kept.beat(Beat(B, B, 7000, RUNNING, 1, known=told.version)))
    assert again.version == told.version and again.news is None and again.place is None
    beat(kept, C, ENDED, 1)  # C's agent ended: the round closes, a new version; B is told why, not its place again
    closed = heard(kept.beat(Beat(B, B, 7000, RUNNING, 1, known=told.version)))
    assert closed.version > told.version and closed.news.why == LOST and closed.place is None


def test_the_beat_interval_grows_with_the_cluster_within_a_quarter_of_lost_bound():
    assert beat_seconds(8, 10) == beat_seconds(1000, 10) == 1.0
    assert beat_seconds(2000, 10) == 2.0 and beat_seconds(4096, 10) == 2.5  # at most lost_bound / 4
    assert beat_seconds(8, 1.5) == 0.5  # a short lost_bound: at most a third of it, whatever the cluster
    kept, clock, said = keeper(low=1, high=4096, lost_bound=10)
    for n in range(2048):
        kept.beat(Beat(f"agent-{n}", f"10.1.{n // 250}.{n % 250}", 7000, WAITING))
    kept.tick()
    assert beat(kept, A).beat == 2.049  # 2,049 agents beating: about 1,000 beats a second


def test_below_min_the_keeper_says_once_how_long_it_waits_and_tells_the_agents():
    lines = []
    kept, clock, said = keeper(low=3, high=3, below_min_timeout=300, say=lines.append)
    beat(kept, A), beat(kept, B)
    advance(kept, clock, 4, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert lines == [] and beat(kept, A).wait is None  # the agents starting: nothing to say yet
    advance(kept, clock, 6, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert len(lines) == 1, lines
    assert lines[0].startswith("the rendezvous has 2 agent(s) ready, fewer than the 3 a round needs: waiting for more")
    assert "at most 295s more (cluster.elastic.below_min_timeout=300), then the run stops (exit 9)" in lines[0]
    kind, line = beat(kept, B).wait
    assert kind == "below" and "2 agent(s) ready, fewer than the 3" in line


def test_an_agent_beyond_max_or_a_second_for_one_node_is_told_why_it_waits():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    assert kept.round.members == [A, B]
    kind, line = beat(kept, C).wait
    assert kind == "full" and line.startswith("not placed: round 1 runs with its most workers (cluster.workers=2)")
    assert "another agent" not in line
    kind, line = beat(kept, A, agent="a second agent on A").wait
    assert kind == "full" and f"another agent at {A} is in it (a second agent for one node waits)" in line
    assert beat(kept, A, RUNNING, 1).wait is None  # placed: nothing to wait for


def test_a_beat_of_another_config_is_refused_said_once_and_never_placed():
    lines = []
    kept, clock, said = keeper(low=2, high=3, say=lines.append, config="a" * 64)
    beat(kept, A), beat(kept, B)
    for _ in range(2):
        told = heard(kept.beat(Beat(C, C, 7000, WAITING, config="b" * 64)))
        kept.tick()
    assert told.refused.startswith("its config is not the run's (config digest bbbbbbbbbbbb there, aaaaaaaaaaaa at")
    assert len(lines) == 1 and lines[0].startswith(f"the rendezvous refused the agent at {C}: its config")
    advance(kept, clock, 6, **{A: (WAITING, 0), B: (WAITING, 0)})
    assert kept.round.members == [A, B] and C not in kept.nodes
