"""Where a process stands in a cluster, decided before TensorFlow starts
(cluster/placement.py), in-process (-m unit): a scheduler's environment is
given as a dict, so every case is a bad TF_CONFIG or Slurm variable and
the one line it gets, or a good one and the place it resolves to. Also the
strategy table and topology names these decisions read."""

import json

import pytest

from config_helpers import PREFIX, refused
from tfdistx import launch as launches
from tfdistx.launch import slurm
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.config import topology
from tfdistx.core import strategies
from tfdistx.core.errors import ConfigError
from tfdistx.config.resolve import layout_of


def placed(cfg, env: dict):
    """The placement this process gets with `env` (None values: unset), as the run and --plan ask."""
    return launches.detect(layout_of(cfg), {k: v for k, v in env.items() if v is not None})


def refused_line(cfg, env: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        placed(cfg, env)
    assert len(caught.value.lines()) == 1, caught.value.lines()
    return caught.value.lines()[0]


def tf_config(cluster, task_type="worker", index=0) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


# Moved from tests/test_cluster.py (they started `python -m tfdistx`): a
# scheduler's bad environment is refused in one line.
SLURM_STEP = {
    "SLURM_JOB_ID": "12",
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "localhost",
    "SLURM_STEP_TASKS_PER_NODE": "2",
    "TF_CONFIG": None,
}


@pytest.mark.unit
@pytest.mark.parametrize(
    "env, phrases",
    [
        ({"SLURM_STEP_NODELIST": "node[1-"}, ["SLURM_STEP_NODELIST='node[1-'", "not a Slurm host list"]),
        ({"SLURM_JOB_ID": "abc"}, ["SLURM_JOB_ID='abc'", "must be a number"]),
        ({"SLURM_STEP_NODELIST": "n[1-3]"}, ["SLURM_STEP_NODELIST='n[1-3]'", "disagree"]),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": -1}}
                )
            },
            ["TF_CONFIG task='worker:-1'", "not in the cluster spec (worker:0..1)"],
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["localhost", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
                )
            },
            ["TF_CONFIG cluster.worker='localhost'", "host:port"],
        ),
    ],
)
def test_a_bad_scheduler_environment_is_refused(configs, env, phrases):
    line = refused_line(configs("strategy=multiworker", "cluster=2x1"), {**SLURM_STEP, **env})
    assert line.startswith(PREFIX) and all(p in line for p in phrases), line


@pytest.mark.unit
def test_tf_config_that_disagrees_with_the_config_is_refused(configs):
    env = {"TF_CONFIG": tf_config({"worker": ["127.0.0.1:1", "127.0.0.1:2"]})}
    assert refused_line(configs("strategy=multiworker", "cluster=4x1"), env) == (
        PREFIX + "TF_CONFIG='2 workers': the config's cluster asks for 4 workers: make cluster= match it"
    )


# -- further bad environments: the exact line --------------------------------

SLURM_2 = {
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}


@pytest.mark.unit
@pytest.mark.parametrize(
    "base, env, line",
    [
        (
            ("strategy=multiworker", "cluster=2x1", "cluster.launch=tf_config"),
            {},
            "TF_CONFIG='': is not a TF_CONFIG with 'cluster' and 'task' (Expecting value: line 1 column 1 (char 0))",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1", "h:2"]}})},
            'TF_CONFIG=\'{"cluster": {"worker": ["h:1", "h:2"]}}\': '
            "is not a TF_CONFIG with 'cluster' and 'task' ('task')",
        ),
        # (a long TF_CONFIG is shown to its 80th character)
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": tf_config({"worker": ["h:1", "h:2"]}, index="one")},
            'TF_CONFIG=\'{"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": "one\': '
            "is not a TF_CONFIG with 'cluster' and 'task' (invalid literal for int() with base 10: 'one')",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": tf_config({"worker": ["h:1", "h:0"]}, index=1)},
            "TF_CONFIG cluster.worker='h:0': every address must be host:port, with a port from 1 to 65535",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": tf_config({"worker": ["h:1", "h:2"]}, task_type="ps")},
            "TF_CONFIG task='ps:0': this task is not in the cluster spec (worker:0..1)",
        ),
        (
            ("strategy=parameter_server", "cluster=ps1w2"),
            {"TF_CONFIG": tf_config({"worker": ["h:1", "h:2"], "ps": ["h:3"]})},
            "TF_CONFIG='2 workers, 1 ps': the config's cluster asks for 1 chief, 1 ps, 2 workers: make cluster= match "
            "it",
        ),
        (
            ("strategy=multiworker", "cluster=2x1", "cluster.launch=slurm"),
            {"SLURM_PROCID": "0"},
            "cluster.launch='slurm': this is not a Slurm step with the usual variables ('SLURM_NTASKS')",
        ),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {**SLURM_2, "SLURM_PROCID": "2"},
            "SLURM_PROCID=2: outside the 2 tasks of the step",
        ),
        (
            ("strategy=multiworker", "cluster=4x1"),
            SLURM_2,
            "cluster='4 workers': the Slurm step has 2 task(s); the config needs 4: srun -n 4",
        ),
    ],
)
def test_a_bad_environment_is_one_exact_line(configs, base, env, line):
    assert refused_line(configs(*base), env) == PREFIX + line


# -- good environments: where the process is placed ---------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "base, env, source, spec, task, chief",
    [
        ((), {"TF_CONFIG": tf_config({"worker": ["h:1"]}), "SLURM_PROCID": "0"}, None, {}, "main", True),
        (("strategy=multiworker", "cluster=2x1"), {}, LaunchMode.LOCAL, {"worker": ["", ""]}, "main", True),
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": tf_config({"worker": ["h:1", "[::1]:2"]}, index=1)},
            LaunchMode.TF_CONFIG,
            {"worker": ["h:1", "[::1]:2"]},
            "worker:1",
            False,
        ),
        # a TFJob's separate chief task counts as worker 0, and is the chief
        (
            ("strategy=multiworker", "cluster=2x1"),
            {"TF_CONFIG": tf_config({"chief": ["c:2222"], "worker": ["w:2222"]}, task_type="chief")},
            LaunchMode.TF_CONFIG,
            {"chief": ["c:2222"], "worker": ["w:2222"]},
            "chief:0",
            True,
        ),
        # TF_CONFIG wins over Slurm's variables when both are set
        (
            ("strategy=multiworker", "cluster=2x1"),
            {**SLURM_2, "TF_CONFIG": tf_config({"worker": ["h:1", "h:2"]})},
            LaunchMode.TF_CONFIG,
            {"worker": ["h:1", "h:2"]},
            "worker:0",
            True,
        ),
        # Slurm: ports shift by 64 per job id (modulo 500); job 501 is shifted by 64
        (
            ("strategy=multiworker", "cluster=2x1"),
            {**SLURM_2, "SLURM_PROCID": "1", "SLURM_JOB_ID": "501"},
            LaunchMode.SLURM,
            {"worker": ["n1:29464", "n1:29465"]},
            "worker:1",
            False,
        ),
        # the job's variables when the step's are not set; one task per node
        (
            ("strategy=multiworker", "cluster=2x1", "cluster.base_port=30000"),
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "1(x2)"},
            LaunchMode.SLURM,
            {"worker": ["a:30000", "b:30000"]},
            "worker:1",
            False,
        ),
    ],
)
def test_a_good_environment_places_the_process(configs, base, env, source, spec, task, chief):
    where = placed(configs(*base), env)
    assert (where.launch, where.cluster_spec, where.task_name, where.is_chief) == (source, spec, task, chief)


@pytest.mark.unit
def test_a_placed_task_hands_tensorflow_its_tf_config(configs):
    where = placed(configs("strategy=multiworker", "cluster=2x1"), {**SLURM_2, "SLURM_PROCID": "1"})
    assert json.loads(where.tf_config()) == {
        "cluster": {"worker": ["n1:29400", "n1:29401"]},
        "task": {"type": "worker", "index": 1},
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),  # moved from test_cluster.py
    ],
)
def test_slurm_host_lists_keep_their_zero_padding(hostlist, hosts):
    assert slurm.expand_hostlist(hostlist) == hosts


@pytest.mark.unit
def test_slurm_tasks_per_node_expand():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


@pytest.mark.unit
def test_parameter_server_cluster_from_a_slurm_step():
    env = {
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "3,2",
    }
    where = slurm.from_slurm(env, {"chief": 1, "ps": 2, "worker": 2}, 29400)
    assert where.cluster_spec == {
        "chief": ["n1:29400"],
        "ps": ["n1:29401", "n1:29402"],
        "worker": ["n2:29400", "n2:29401"],
    }
    assert (where.task_type, where.task_index, where.is_chief) == ("ps", 1, False)


@pytest.mark.unit
def test_slurm_step_of_the_wrong_size_is_refused():
    env = {
        "SLURM_PROCID": "0",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "n1",
        "SLURM_STEP_TASKS_PER_NODE": "3",
    }
    with pytest.raises(ConfigError, match="srun -n 2"):
        slurm.from_slurm(env, {"worker": 2}, 29400)


@pytest.mark.unit
@pytest.mark.parametrize("hostlist", ["n1,", "n[1-2]x", "", "n[a-b]"])
def test_malformed_slurm_host_lists_are_refused(hostlist):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(hostlist)


# -- the strategy table: what `auto` becomes and what each strategy runs ------


@pytest.mark.unit
@pytest.mark.parametrize(
    "name, workers, devices, resolved",
    [
        ("auto", 1, None, "one_device"),
        ("auto", 1, 4, "mirrored"),
        ("auto", 3, 1, "multiworker"),
    ],
)
def test_auto_resolves_from_the_cluster(name, workers, devices, resolved):
    assert strategies.resolve(name, workers, devices) == resolved


@pytest.mark.unit
@pytest.mark.parametrize(
    "name, workers, devices, ps, jobs, replicas",
    [
        ("mirrored", 1, None, 0, {}, None),  # the GPUs found decide
        ("multiworker", 3, 2, 0, {"worker": 3}, 3),
        ("parameter_server", 4, 1, 2, {"chief": 1, "ps": 2, "worker": 4}, 1),  # each step is one worker's batch
    ],
)
def test_each_strategy_plans_its_tasks_and_replicas(name, workers, devices, ps, jobs, replicas):
    row = strategies.get(name, workers, devices)
    assert (row.job_counts(workers, ps), row.planned_replicas(workers, devices)) == (jobs, replicas)


@pytest.mark.unit
def test_job_counts_read_as_words():
    assert strategies.describe_jobs({"chief": 1, "ps": 2, "worker": 1}) == "1 chief, 2 ps, 1 worker"
    assert strategies.describe_jobs({"worker": 0}) == ""


@pytest.mark.unit
@pytest.mark.parametrize(
    "name, node",
    [
        ("1x4", {"workers": 1, "devices_per_worker": 4, "ps": 0}),
        ("4x8", {"workers": 4, "devices_per_worker": 8, "ps": 0}),
        ("ps2w4", {"workers": 4, "devices_per_worker": 1, "ps": 2}),
        (
            "ps0w2",
            {"workers": 2, "devices_per_worker": 1, "ps": 0},
        ),  # parsed; validation refuses it (test_unit_config_checks)
    ],
)
def test_topology_names_parse_to_their_cluster(name, node):
    parsed = topology.parse(name)
    assert {k: parsed[k] for k in node} == node and parsed["base_port"] == 29400


@pytest.mark.unit
@pytest.mark.parametrize("name", ["4x", "x8", "ps2", "w4", "2*4", "local2"])
def test_malformed_topology_names_are_refused(tmp_path, name):
    assert topology.parse(name) is None
    assert any("WxD" in line for line in refused(tmp_path / "run", f"cluster={name}"))


@pytest.mark.unit
def test_cluster_sweep_registers_every_name():
    assert topology.requested_names(["cluster=1x2,2x1", "model=mlp"]) == ["1x2", "2x1"]


@pytest.mark.unit
def test_a_cluster_name_sets_the_cluster_and_keeps_the_other_keys(configs):
    cluster = configs("cluster=3x2", "cluster.max_restarts=0", "data.batch_size=96").cluster
    assert (
        cluster.name,
        cluster.workers,
        cluster.devices_per_worker,
        cluster.ps,
        cluster.max_restarts,
        cluster.launch,
    ) == ("3x2", 3, 2, 0, 0, "auto")
