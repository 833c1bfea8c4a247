"""Elastic training's config (core/elastic.py), in-process: `cluster.workers=MIN:MAX`,
the `cluster.elastic` keys, `--plan`'s line, and every run that cannot be
elastic refused in one line before TensorFlow starts. The rounds themselves,
on a real local cluster: test_elastic.py."""

import json
import re
import sys

import pytest

from config_helpers import compose_ok, refused
from tfdistx.launch.local.hosts import HostList, Settled, choose
from tfdistx.cluster.launch_spec import LaunchSpec, RoundsRecord
from tfdistx.core.run_spec import Bounds
from tfdistx.cluster.launch_spec import Rounds as LaunchRounds
from tfdistx.cluster.rounds import Rounds
from tfdistx.commands.plan import describe
from tfdistx.config.resolve import resolve
from tfdistx.core import elastic, launch_mode
from tfdistx.core.errors import ConfigError

pytestmark = pytest.mark.unit

ELASTIC = ["strategy=multiworker", "cluster.workers=4", "cluster.elastic.min_workers=2", "data.batch_size=24"]


@pytest.fixture
def hosts(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1\n127.0.0.2\n")
    return path


@pytest.fixture(autouse=True)
def no_scheduler(monkeypatch):
    """--plan reads this process's environment: no TF_CONFIG or Slurm step here."""
    for name in ("TF_CONFIG", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)


def test_min_colon_max_is_the_most_workers_and_the_fewest():
    assert elastic.expand_shorthand(["strategy=multiworker", "cluster.workers=2:4", "cluster.workers=3"]) == [
        "strategy=multiworker",
        "cluster.workers=4",
        "cluster.elastic.min_workers=2",
        "cluster.workers=3",
    ]


@pytest.mark.parametrize("typed", ["4:2", "3:2", "2:x", ":4", "0:2"])
def test_a_min_colon_max_that_is_not_one_is_refused_as_typed(typed):
    with pytest.raises(ConfigError) as refused_here:
        elastic.expand_shorthand(["strategy=multiworker", f"cluster.workers={typed}"])
    assert refused_here.value.lines() == [
        f"tfdistx: invalid config: cluster.workers={typed!r}: MIN:MAX with MIN <= MAX, both whole "
        "numbers >= 1 (an elastic run of MIN to MAX workers), or one number of workers"
    ]


def test_an_elastic_run_composes_and_plan_shows_its_range_and_bounds(tmp_path, hosts):
    cfg = compose_ok(
        tmp_path / "run",
        *elastic.expand_shorthand(["strategy=multiworker", "cluster.workers=2:4"]),
        f"cluster.elastic.hosts={hosts}",
        "data.batch_size=24",
        "cluster.elastic.lost_bound=7",
    )
    assert elastic.is_elastic(cfg.cluster) and elastic.worker_range(cfg.cluster) == (2, 4)
    line = next(line for line in describe(cfg).splitlines() if line.startswith("elastic"))
    assert f"2:4 workers, one per host listed in {hosts}" in line and "a lost host 7s" in line and "exit 9" in line, (
        line
    )
    assert not elastic.is_elastic(compose_ok(tmp_path / "run", "strategy=multiworker", "cluster=2x1").cluster)
    # parameter servers: any batch (each step is one worker's whole batch)
    cfg = compose_ok(
        tmp_path / "run",
        "strategy=parameter_server",
        "cluster=ps1w3",
        "cluster.elastic.min_workers=2",
        f"cluster.elastic.hosts={hosts}",
        "data.batch_size=32",
    )
    assert elastic.worker_range(cfg.cluster) == (2, 3)
    assert elastic.for_round(resolve(cfg, str(tmp_path / "run")), 2).cluster.name == "ps1w2"


def test_a_round_s_task_spec_is_its_topology(tmp_path, hosts):
    spec = resolve(compose_ok(tmp_path / "run", *ELASTIC, f"cluster.elastic.hosts={hosts}"), str(tmp_path / "run"))
    round_ = elastic.for_round(spec, 3)
    assert (round_.cluster.workers, round_.cluster.name, round_.config["cluster"]["name"]) == (3, "3x1", "3x1")
    assert round_.layout.training_jobs() == {"worker": 3} and spec.cluster.workers == 4  # the run's own: unchanged


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["strategy=one_device", "cluster.elastic.min_workers=1"], "strategy='one_device': trains in one process"),
        (["strategy=mirrored", "cluster.elastic.min_workers=1"], "strategy='mirrored': trains in one process"),
        (
            ["strategy=central_storage", "cluster.elastic.min_workers=1"],
            "strategy='central_storage': trains in one process",
        ),
        (["strategy=tpu", "cluster.elastic.min_workers=1"], "strategy='tpu': trains in one process"),
        (
            [*ELASTIC, "data.service.workers=1"],
            "data.service.workers=1: a tf.data service job cannot re-form its trainers",
        ),
        ([*ELASTIC, "cluster.evaluator=true"], "cluster.evaluator=True: the sidecar evaluator is not kept"),
        (
            [*ELASTIC, "cluster.launch=slurm"],
            "cluster.workers='2:4': an elastic run needs its processes started by tfdistx's local launcher "
            "(cluster.launch=local) or by tfdistx's agents, one on every node (cluster.launch=agent), and "
            "cluster.launch=slurm has them started by a scheduler",
        ),
        (
            [*ELASTIC[:-1], "data.batch_size=32"],
            "data.batch_size=32: an elastic run keeps its global batch on every round, "
            "split across 2, 3, 4 replicas: use a multiple of 12",
        ),
        (
            [
                "strategy=multiworker",
                "cluster.workers=3",
                "cluster.elastic.min_workers=2",
                "data.batch_size=128",
            ],  # not even MAX's multiple:
            "data.batch_size=128: an elastic run keeps its global batch on every round, split across 2, 3 replicas: "
            "use a multiple of 6",
        ),
        (
            [*ELASTIC, "optimizer.scale_lr_with_replicas=true"],
            "optimizer.scale_lr_with_replicas=True: an elastic run's rounds",
        ),
        ([*ELASTIC, "cluster.elastic.join_grace=0"], "cluster.elastic.join_grace=0.0: seconds, more than 0"),
        (
            ["strategy=multiworker", "cluster.workers=4", "cluster.elastic.min_workers=5"],
            "cluster.elastic.min_workers=5: from 1 to cluster.workers=4",
        ),
        (
            ["strategy=multiworker", "cluster.workers=4", "cluster.elastic.min_workers=0"],
            "cluster.elastic.min_workers=0: from 1 to cluster.workers=4",
        ),
        (
            [*ELASTIC, "cluster.elastic.hosts=/nonexistent/hosts"],
            "cluster.elastic.hosts='/nonexistent/hosts': no such file",
        ),
        (
            [*ELASTIC, "cluster.elastic.discover='echo 127.0.0.1'"],
            "cluster.elastic.discover='echo 127.0.0.1': set with cluster.elastic.hosts=",
        ),
    ],
)
def test_what_cannot_be_elastic_is_refused_in_one_line(tmp_path, hosts, overrides, said):
    given_hosts = [] if any("hosts=" in o for o in overrides) else [f"cluster.elastic.hosts={hosts}"]
    lines = refused(tmp_path / "run", *overrides, *given_hosts)
    assert len(lines) == 1 and said in lines[0], lines


def test_an_elastic_run_needs_its_hosts(tmp_path):
    lines = refused(tmp_path / "run", *ELASTIC)
    assert len(lines) == 1 and "cluster.elastic.hosts=None: an elastic run needs its hosts" in lines[0], lines
    assert compose_ok(tmp_path / "run", *ELASTIC, "cluster.elastic.discover='echo 127.0.0.1'").cluster.elastic.discover


def test_the_host_list_is_read_from_a_file_or_a_command(tmp_path, capsys):
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1\n\n# the spare\n127.0.0.3  # rack 2\n127.0.0.1\n")
    assert HostList(str(path), None).read() == ["127.0.0.1", "127.0.0.3"]
    command = HostList(None, f"cat {path}")
    assert command.read() == ["127.0.0.1", "127.0.0.3"]
    path.unlink()
    assert command.read() == ["127.0.0.1", "127.0.0.3"]  # a command that fails keeps the last list, said once
    assert command.read() == ["127.0.0.1", "127.0.0.3"]
    assert capsys.readouterr().err.count("cannot read the hosts") == 1


def test_a_round_keeps_its_chief_first_and_takes_at_most_max():
    assert choose(["a", "b", "c", "d", "e"], None, 4) == ["a", "b", "c", "d"]
    assert choose(["c", "a", "b"], "a", 4) == ["a", "c", "b"]
    assert choose(["b", "c"], "a", 4) == []  # without the chief's host no round forms


def test_a_task_a_scheduler_placed_is_refused_not_trained_on_max_workers(tmp_path, hosts):
    cfg = compose_ok(tmp_path / "run", *ELASTIC, f"cluster.elastic.hosts={hosts}")
    refused_here = launch_mode.refused([elastic.needs(cfg.cluster)], cfg.cluster.launch, placed_by_a_scheduler=True)
    assert len(refused_here) == 1 and "placed by a scheduler" in str(refused_here[0]), refused_here
    assert launch_mode.refused([elastic.needs(cfg.cluster)], cfg.cluster.launch) == []  # a round's task: its launcher's
    fixed = compose_ok(tmp_path / "run", "strategy=multiworker", "cluster=2x1").cluster
    assert elastic.needs(fixed) is None


def test_the_rounds_go_on_counting_and_a_damaged_record_is_kept_aside(tmp_path):
    said = []
    path = tmp_path / "rounds.json"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-12.index").touch()
    Rounds(str(path), str(tmp_path / "checkpoints"), str(tmp_path / "metrics.jsonl"), said.append).start(
        {"worker:0": "127.0.0.1", "worker:1": "127.0.0.2"}, "started"
    )
    again = Rounds(str(path), str(tmp_path / "checkpoints"), str(tmp_path / "metrics.jsonl"), said.append)
    again.start({"worker:0": "127.0.0.1"}, "lost worker:1 at 127.0.0.2")
    assert said == [
        "round 1: 2 workers (started), resuming from step 12",
        "round 2: 2 -> 1 workers (lost worker:1 at 127.0.0.2), resuming from step 12",
    ]
    assert [r["first_step"] for r in json.loads(path.read_text())] == [13, 13]
    path.write_text("{not json")
    Rounds(str(path), str(tmp_path / "checkpoints"), str(tmp_path / "metrics.jsonl"), said.append)
    assert "cannot be read: kept as" in said[-1]
    assert [p.read_text() for p in tmp_path.glob("rounds.replaced-*.json")] == ["{not json"] and not path.exists()


@pytest.mark.parametrize("kind", ["tfjob", "jobset"])
def test_an_elastic_run_is_not_exported_to_kubernetes(capsys, kind):
    from tfdistx.commands import kubernetes

    with pytest.raises(SystemExit) as leaving:
        kubernetes.write(
            [
                "strategy=multiworker",
                "cluster.workers=2:4",
                "cluster.elastic.discover=echo 127.0.0.1",
                "data.batch_size=24",
                "--image",
                "tfdistx:test",
            ],
            kind,
        )
    lines = capsys.readouterr().err.strip().splitlines()
    assert leaving.value.code == 2 and len(lines) == 1, lines
    launch = {"tfjob": "tf_config", "jobset": "jobset"}[kind]  # the pods' own, which the export composes with
    assert lines[0].startswith(
        "tfdistx: invalid config: cluster.workers='2:4': an elastic run needs its processes started by tfdistx's "
        "local launcher (cluster.launch=local) or by tfdistx's agents, one on every node (cluster.launch=agent), and "
        f"cluster.launch={launch} has them started by a scheduler"
    )


def test_summary_json_keeps_the_rounds_that_trained():
    from tfdistx.commands.execute import with_rounds

    rounds = [{"round": 1, "first_step": 1}, {"round": 2, "first_step": 13}]
    summary = {"step": 48, "rounds": rounds}
    rerun = rounds + [{"round": 3, "first_step": 49}]  # a rerun of the finished run: nothing trained
    assert with_rounds(summary, rerun) == summary
    assert with_rounds({"step": 96}, rerun)["rounds"] == rerun  # a rerun with more steps trains in round 3


@pytest.mark.parametrize("value", ["false", "true", "123"])
def test_a_discover_that_is_not_a_command_is_refused_not_run(tmp_path, value):
    """`cluster.elastic.discover=false` is YAML's boolean: refused in one line, not run as a command named False."""
    lines = refused(tmp_path / "run", *ELASTIC, f"cluster.elastic.discover={value}")
    assert (
        len(lines) == 1
        and lines[0].startswith("tfdistx: invalid config: cluster.elastic.discover=")
        and "(a string), or null" in lines[0]
    )


def test_a_host_the_launcher_cannot_use_is_left_out_said_once_with_what_is_allowed(tmp_path, capsys):
    """Every task runs on this machine: a host is a loopback address, without a port. A bad line is left
    out of the list (re-read while the run goes on: a typo must not end it), and said once, naming the
    list, the value and what is allowed; so is a host listed twice."""
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1\n8.8.8.8\ngarbage!!host\n127.0.0.1:2222\n127.0.0.2\n127.0.0.2\nlocalhost\n")
    listed = HostList(str(path), None)
    assert listed.read() == ["127.0.0.1", "127.0.0.2"]
    assert listed.read() == ["127.0.0.1", "127.0.0.2"]  # read again: nothing said twice
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 5, lines
    said = dict(zip(["8.8.8.8", "garbage!!host", "127.0.0.1:2222", "127.0.0.2", "localhost"], lines))
    for host, line in said.items():
        assert line.startswith(f"tfdistx: warning: {path}: host ") and host in line, line
    assert (
        "'8.8.8.8' left out: not an address of this machine: a loopback address of this machine, 127.0.0.N"
        in said["8.8.8.8"]
    )
    assert (
        "left out: not an IPv4 address" in said["garbage!!host"]
        and "left out: not an IPv4 address" in said["localhost"]
    )
    assert "left out: a host, not host:port, is expected" in said["127.0.0.1:2222"]
    assert "127.0.0.2 is listed more than once: one worker runs there" in said["127.0.0.2"]
    command = HostList(None, "echo 8.8.8.8; echo 127.0.0.3")
    assert command.read() == ["127.0.0.3"]
    assert capsys.readouterr().err.startswith(
        "tfdistx: warning: `echo 8.8.8.8; echo 127.0.0.3`: host '8.8.8.8' left out"
    )


def test_bad_hosts_leave_too_few_and_the_usual_wait_below_min_applies(tmp_path):
    """Two lines where 2:2 needs two, one of them 8.8.8.8: no round forms, the wait below MIN is said, and exit 9."""
    from tfdistx.launch.local.elastic import HostListMembership
    from tfdistx.cluster.processes import ForwardingSignals
    from tfdistx.cluster.supervisor import NoRound

    path = tmp_path / "hosts"
    path.write_text("127.0.0.1\n8.8.8.8\n")
    said = []
    membership = HostListMembership(
        elastic_spec(tmp_path, below_min_timeout=0.3),
        HostList(str(path), None, say=said.append),
        Rounds(str(tmp_path / "rounds.json"), str(tmp_path), str(tmp_path / "metrics.jsonl"), said.append),
        said.append,
    )
    with pytest.raises(NoRound) as none, ForwardingSignals([]) as signals:
        membership.form("started", signals)
    assert none.value.code == 9 and "host '8.8.8.8' left out" in said[0], said
    assert "1 host(s) usable" in said[1] and "waiting for more" in said[1] and "exit 9" in said[2], said


def elastic_spec(tmp_path, **bounds) -> LaunchSpec:
    """Three sleeping workers in rounds of 2 to 3, as the local launcher hands them to its supervisor."""
    sleeper = (sys.executable, "-c", "import time; time.sleep(120)")
    bounds = {"join_grace": 0.1, "lost_bound": 3, "below_min_timeout": 30, **bounds}
    record = RoundsRecord(str(tmp_path / "rounds.json"), str(tmp_path), str(tmp_path / "metrics.jsonl"))
    return LaunchSpec(
        command=sleeper,
        log_dir=str(tmp_path),
        run_log=None,
        primary=("worker",),
        counts={"worker": 3},
        rounds=LaunchRounds(Bounds(min=2, max=3, **bounds), record),
    )


def test_a_change_of_the_list_counts_once_it_has_held_its_bound():
    now = [0.0]
    settled = Settled(3, clock=lambda: now[0])
    assert settled.update(["a", "b", "c"]) == ["a", "b", "c"]  # the first list, as it is
    now[0] = 1
    assert settled.update(["a", "b"]) == ["a", "b", "c"]  # c gone for 0 s: still counts
    now[0] = 3.5
    assert settled.update(["a", "b"]) == ["a", "b", "c"]  # 2.5 s
    now[0] = 4
    assert settled.update(["a", "b"]) == ["a", "b"]  # 3 s: gone
    assert settled.update(["a", "b", "c"]) == ["a", "b"]  # back: not yet
    now[0] = 7
    assert settled.update(["a", "b", "c"]) == ["a", "b", "c"]


def test_a_flapping_host_changes_no_round_and_its_worker_keeps_running(tmp_path):
    """A host file rewritten every second for six seconds, a host out and back
    each time: with lost_bound=3 its change never holds, so the running round
    (real processes) is not ended and no task is stopped; once the host stays
    out for its bound, its worker is stopped, once."""
    from tfdistx.launch.local import elastic as elastic_launcher
    from tfdistx.launch.local.elastic import HostListMembership
    from tfdistx.cluster.processes import ForwardingSignals, teardown

    path, said = tmp_path / "hosts", []
    hosts = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    path.write_text("\n".join(hosts) + "\n")
    now = [100.0]
    membership = HostListMembership(
        elastic_spec(tmp_path),
        HostList(str(path), None, say=said.append),
        Rounds(str(tmp_path / "rounds.json"), str(tmp_path), str(tmp_path / "metrics.jsonl"), said.append),
        said.append,
    )
    membership.settled.clock = lambda: now[0]
    real_clock = elastic_launcher.time.monotonic
    with ForwardingSignals([]) as signals:
        round_ = membership.form("started", signals)
        for task in round_.tasks:
            task.start()
        try:
            changes = []
            for second in range(12):  # out on even seconds, back on odd ones
                path.write_text("\n".join(hosts if second % 2 else hosts[:2]) + "\n")
                now[0] += 1
                membership.next_read = real_clock() - 1  # read at this call, as once a second
                changes.append(membership.check(round_, signals))
            assert changes == [None] * 12 and all(task.proc.poll() is None for task in round_.tasks), said
            assert not any("left the host list" in line or "listed:" in line for line in said), said
            for _ in range(4):  # now it stays out: after lost_bound its worker is stopped, once
                path.write_text("\n".join(hosts[:2]) + "\n")
                now[0] += 1
                membership.next_read = real_clock() - 1
                membership.check(round_, signals)
            assert sum("127.0.0.3 left the host list" in line for line in said) == 1, said
            assert round_.lost == {"worker:2": "127.0.0.3"} and round_.tasks[2].proc.poll() is not None
            assert all(task.proc.poll() is None for task in round_.tasks[:2])
        finally:
            teardown(round_.tasks, ["worker"], grace=0, signalled=False)
    assert not (tmp_path / ".scratch").exists()  # each task's scratch went with it


AGENT = ["strategy=multiworker", "cluster.launch=agent", "cluster.agent.store=10.0.0.1:29500"]


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["strategy=multiworker", "cluster.launch=agent"], "cluster.agent.store=None: host:port of the rendezvous"),
        (
            ["strategy=multiworker", "cluster.launch=agent", "cluster.agent.store=node1"],
            "cluster.agent.store='node1': host:port",
        ),
        (
            [*AGENT, "cluster.agent.address=10.0.0.2:80"],
            "cluster.agent.address='10.0.0.2:80': this node's host name or IP address, without a port",
        ),
        (
            [*AGENT, "cluster.agent.token_file=5"],
            "cluster.agent.token_file=5: a file holding the run's secret, the same on every node",
        ),
        (
            [*AGENT[1:], "strategy=mirrored"],
            "strategy='mirrored': an agent on every node runs one worker per node, of a multi-worker "
            "cluster: use strategy=multiworker or strategy=parameter_server",
        ),
        (
            [
                *AGENT,
                "cluster.workers=4",
                "cluster.elastic.min_workers=2",
                "data.batch_size=24",
                "data.service.workers=1",
            ],
            "data.service.workers=1: a tf.data service job cannot re-form its trainers between rounds",
        ),
        (
            [
                *AGENT,
                "cluster.workers=4",
                "cluster.elastic.min_workers=2",
                "data.batch_size=24",
                "cluster.evaluator=true",
            ],
            "cluster.evaluator=True: the sidecar evaluator is not kept across an elastic run's rounds",
        ),
        (
            [
                *AGENT,
                "cluster.workers=4",
                "cluster.elastic.min_workers=2",
                "cluster.elastic.hosts=/etc/hosts",
                "data.batch_size=24",
            ],
            "cluster.elastic.hosts='/etc/hosts': with cluster.launch=agent the nodes are the agents",
        ),
    ],
)
def test_what_agents_cannot_run_is_refused_in_one_line(tmp_path, overrides, said):
    lines = refused(tmp_path / "run", *overrides)
    assert len(lines) == 1 and said in lines[0], lines


def test_an_elastic_run_of_agents_needs_no_host_list_and_plan_shows_the_rendezvous(tmp_path):
    cfg = compose_ok(
        tmp_path / "run",
        *AGENT,
        "cluster.workers=4",
        "cluster.elastic.min_workers=2",
        "data.batch_size=24",
        "cluster.elastic.lost_bound=5",
    )
    plan = describe(cfg)
    assert (
        "agents        one per node, 2:4 workers, meeting at 10.0.0.1:29500 (its host's agent keeps the rounds); a "
        "round waits 10s past 2 agents for 4, a node silent 5s is lost, and the run stops after 300s below 2 (exit "
        "9); every beat proves the run's secret (the run dir's logs/rendezvous.key, made by the first agent)"
    ) in plan, plan
    assert "placement     an agent on every node" in plan and "elastic       " not in plan, plan


def test_under_agents_the_servers_run_on_the_stores_node(tmp_path):
    plan = describe(
        compose_ok(
            tmp_path / "run", *AGENT[1:], "strategy=parameter_server", "cluster=ps2w3", "cluster.elastic.min_workers=2"
        )
    )
    assert "(its host's agent keeps the rounds and runs 1 chief, 2 ps)" in plan, plan
    assert "  servers     1 chief, 2 ps, on the store's node beside its worker" in plan, plan
    assert re.search(
        r"^  threads     the store's node's tasks: .*shared by 2 chief and worker task\(s\)", plan, re.M
    ), plan  # its chief steps too
    plan = describe(compose_ok(tmp_path / "run", *AGENT, "cluster=2x1", "data.service.workers=2"))
    assert "  servers     1 dispatcher, 2 dataworkers, on the store's node beside its worker" in plan, plan


def test_a_fixed_run_of_agents_has_its_sidecar_evaluator_on_the_stores_node(tmp_path):
    plan = describe(compose_ok(tmp_path / "run", *AGENT, "cluster=2x1", "cluster.evaluator=true"))
    assert "  task        evaluator:0  the sidecar evaluator, on the store's node beside its worker" in plan, plan


def test_agents_are_exported_as_a_jobset_only(capsys):
    from tfdistx.commands import kubernetes

    for kind in ("tfjob", "trainjob"):
        with pytest.raises(SystemExit) as leaving:
            kubernetes.write([*AGENT, "cluster=2x1", "--image", "img"], kind)
        lines = capsys.readouterr().err.strip().splitlines()
        assert leaving.value.code == 2 and len(lines) == 1 and "an agent on every node runs as a JobSet" in lines[0], (
            lines
        )
