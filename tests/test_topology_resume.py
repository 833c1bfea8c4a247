"""A run checkpointed under one topology resumes under another, on real local
clusters: no step lost or repeated, the examples after the resume those a
whole run trains. The probe, its checks and the topologies in this process:
test_unit_topology_resume.py."""

import time

import pytest

from test_unit_topology_resume import PROBE, STEPS, STOP, TOPOLOGIES, check_resumed


# -- real clusters -------------------------------------------------------------------


def resume_across(tfdistx, tmp_path, whole, before: str, after: str) -> float:
    """Train STOP steps on `before`, resume to STEPS on `after`, check; the seconds it took."""
    started = time.time()
    run_dir = tmp_path / "run"
    first = tfdistx(*PROBE, *TOPOLOGIES[before][0], f"trainer.steps={STOP}", run_dir=run_dir)
    assert first.returncode == 0, first
    resumed = tfdistx(*PROBE, *TOPOLOGIES[after][0], f"trainer.steps={STEPS}", run_dir=run_dir)
    assert resumed.returncode == 0, resumed
    check_resumed(run_dir, resumed.summary, before, after, whole, resumed.stdout + resumed.stderr)
    return time.time() - started


# The default run: a cluster onto one device (test_partitioner's default test resumes ps2w2 onto ps1w2).
@pytest.mark.parametrize(
    "before, after", [("multiworker_2x1", "one_device"), pytest.param("ps1w2", "mirrored_1x2", marks=pytest.mark.slow)]
)
def test_a_cluster_run_resumes_on_another_topology(tfdistx, tmp_path, topology_whole, before, after):
    resume_across(tfdistx, tmp_path, topology_whole, before, after)


MATRIX = [  # each topology resumed onto another; every change of the number of ps re-splits the tables
    ("one_device", "multiworker_4x1"),
    ("mirrored_1x2", "ps2w4"),
    ("multiworker_2x1", "mirrored_1x2"),
    ("multiworker_4x1", "ps1w2"),
    ("ps1w2", "ps2w4"),
    ("ps2w4", "one_device"),
    ("ps2w4", "multiworker_2x1"),
]


@pytest.mark.slow
@pytest.mark.parametrize("before, after", MATRIX)
def test_topology_matrix(tfdistx, tmp_path, topology_whole, before, after):
    seconds = resume_across(tfdistx, tmp_path, topology_whole, before, after)
    print(f"{before} -> {after}: {seconds:.1f} s")
