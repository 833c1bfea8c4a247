"""The agents' rendezvous at scale, in the default run: a real keeper in a
process of its own and 256 simulated agents (tests/simulated_agents.py: no
TensorFlow, each its own socket, its real beats) started within a second;
10% of them killed at once. The figures (how fast, at what cost) are
benchmarks/bench_rendezvous.py's; this holds what a user counts on: one
round of every agent, then the next without the lost, and no connection
error on the way."""

from conftest import wait_until
from simulated_agents import Simulation

AGENTS, KILLED = 256, 26


def test_256_agents_form_one_round_and_the_next_after_a_tenth_are_killed(tmp_path):
    with Simulation(AGENTS, KILLED, low=AGENTS - KILLED, scratch=tmp_path, join_grace=1.0, lost_bound=3.0) as sim:
        wait_until(lambda: 1 in sim.rounds, 60, "the first round", [sim.keeper])
        assert sim.workers[1] == AGENTS, sim.workers  # every agent, at once: MAX of them
        # every agent told it is in round 1 (it beats `running` then), before any is killed
        wait_until(lambda: _all_placed(sim, 1), 30, "every agent in round 1", [sim.keeper])
        sim.kill()
        wait_until(lambda: 2 in sim.rounds, 60, "the next round", [sim.keeper])
        figures = sim.figures()
    assert sim.workers == {1: AGENTS, 2: AGENTS - KILLED}
    assert len(figures["first_beat"]) == AGENTS and not figures["errors"], figures["errors"]


def _all_placed(sim: Simulation, number: int) -> bool:
    """Whether every agent has learned it is in round `number` (their figures so far)."""
    return sum(number in rounds for rounds in sim.snapshot()["placed"].values()) == sim.agents
