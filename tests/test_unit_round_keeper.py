"""The agents' rendezvous (cluster/round_keeper.py): which agents form each
round, when a round closes, and every wait bounded. Its clock is the test's,
so that a bound of seconds is tested without waiting for it; one test asks
a real keeper over the network as the agents do."""

import pytest

from tfdistx.cluster.agent import Beats
from tfdistx.cluster.round_keeper import (
    DONE,
    ENDED,
    FAILED,
    GROW,
    LOST,
    RUNNING,
    TASK_FAILED,
    WAITING,
    RoundKeeper,
    answer,
    listen,
)

pytestmark = pytest.mark.unit

A, B, C, D = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def keeper(low=2, high=3, join_grace=5, lost_bound=3, below_min_timeout=60):
    clock, said = Clock(), []
    kept = RoundKeeper(
        low, high, join_grace, lost_bound, below_min_timeout, on_round=lambda *a: said.append(a), clock=clock
    )
    return kept, clock, said


def beat(kept, address, status=WAITING, number=0, code=0, agent=None):
    """A beat of the agent on `address` (named after it, unless `agent` names it)."""
    return kept.beat(agent or address, address, 7000, status, number, code)


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
        answer_ = beat(kept, address)
    formed = answer_["round"]
    assert formed["number"] == 1 and formed["members"] == [A, B, C] and formed["why"] is None
    assert formed["workers"] == [f"{A}:7000", f"{B}:7000", f"{C}:7000"]
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
    stopped = beat(kept, A)["stopped"]
    assert stopped["code"] == 9 and "fewer than the 2 a round needs" in stopped["why"] and not said


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
    closed = beat(kept, B, RUNNING, 1)["round"]
    assert closed["why"] == TASK_FAILED and closed["code"] == 1
    beat(kept, A), beat(kept, B)
    assert kept.round.number == 2 and kept.round.members == [A, B] and said[-1][2] == "restart after exit code 1"


def test_an_agent_that_ended_is_lost_at_once_and_one_restarted_once_silent():
    kept, clock, said = keeper(low=2, high=2)
    beat(kept, A), beat(kept, B)
    assert beat(kept, B, ENDED, 1)["round"]["why"] == LOST
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
    assert not beat(kept, B, RUNNING, 1)["finished"]
    assert beat(kept, B, DONE, 1)["finished"]
    assert not kept.settled()  # A, done first, has not heard that B is: it would wait out its bound
    assert beat(kept, A, DONE, 1)["finished"] and kept.settled()
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
    formed = beat(kept, A)["round"]
    assert formed["members"] == [C, A, B] and formed["servers"] == {"chief": [f"{C}:8000"], "ps": [f"{C}:8001"]}
    assert said[-1][1] == {"chief:0": C, "ps:0": C, "worker:0": C, "worker:1": A, "worker:2": B}
    beat(kept, C, DONE, 1)  # the chief finished: the other nodes' workers only served it
    assert beat(kept, A, RUNNING, 1)["finished"] and beat(kept, B, RUNNING, 1)["round"]["why"] == "done"


def test_agents_reach_a_real_keeper_over_the_network_and_a_silent_keeper_is_noticed():
    kept, clock, said = keeper(low=1, high=1)
    server = listen(kept, "127.0.0.1", 0)
    answer(server)
    store = f"127.0.0.1:{server.server_address[1]}"
    beats = Beats(store, "127.0.0.1")
    beats.set(WAITING, port=7001)
    assert beats.last["round"]["workers"] == ["127.0.0.1:7001"] and beats.silent_for() < 1
    server.shutdown()
    server.server_close()
    answered = beats.answered
    beats.beat()  # nobody answers: the last answer is kept, and how long ago it came
    assert beats.answered == answered


def test_a_rerun_counts_its_rounds_on_from_those_the_run_had():
    kept, clock, said = keeper(low=1, high=1)
    kept.numbered_after = 2  # logs/rounds.json held two: a requeued job's agents say round 3
    assert beat(kept, A)["round"]["number"] == 3 and said[-1][0] == 3
