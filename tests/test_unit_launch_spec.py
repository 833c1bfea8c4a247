"""The LaunchSpec (cluster/launch_spec.py): what the supervisor of a run's
processes is handed, one frozen record made from the run spec, and its
JSON by one function each way (core/typed_json.py), read back typed."""

import dataclasses

import pytest

from config_helpers import compose_ok
from tfdistx.cluster.launch_spec import LaunchSpec, Rendezvous, Rounds, RoundsRecord
from tfdistx.core.run_spec import Bounds
from tfdistx.config.resolve import resolve
from tfdistx.core import typed_json

pytestmark = pytest.mark.unit


def test_a_launch_spec_is_made_from_the_run_spec_and_comes_back_from_json_as_it_was(tmp_path):
    overrides = (
        "strategy=parameter_server",
        "cluster=ps1w2",
        "cluster.max_restarts=3",
        "cluster.notice_signals=[USR2]",
    )
    spec = resolve(compose_ok(tmp_path / "run", *overrides), str(tmp_path / "run"))
    record = RoundsRecord.of(spec.run_dir, spec.checkpoint.dir)
    made = LaunchSpec.of(
        spec,
        ["python", "-m", "tfdistx", "_task"],
        counts={"chief": 1, "ps": 1, "worker": 2},
        task_env={"TF_NUM_INTEROP_THREADS": "2"},
        rounds=Rounds(Bounds(1, 2, 0.5, 10.0, 60.0), record, hosts="/etc/hosts"),
        agent=Rendezvous("h:1", None, None, "digest", str(spec.run_dir), {"ps": 1}, {}, {"config.yaml": "a: 1\n"}),
    )
    # the run's own keys, read once here, not by string key in the supervisor
    assert (made.max_restarts, made.notice_signals, made.primary) == (3, ("USR2",), ("chief",))
    assert made.log_dir == str(spec.run_dir / "logs") and made.command == ("python", "-m", "tfdistx", "_task")
    back = typed_json.loads(LaunchSpec, typed_json.dumps(made))
    assert back == made and isinstance(back.rounds.bounds, Bounds) and isinstance(back.command, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.max_restarts = 0


def test_a_task_is_handed_the_resolved_run_spec_and_resolves_nothing_again(tmp_path):
    """The command a launcher or an agent starts a task with names the run spec written for it (typed JSON,
    cluster.launch=tf_config: placed by the TF_CONFIG it is given); commands/task.py reads it back as it was, and
    imports nothing that composes or resolves a config."""
    import ast
    import inspect

    from tfdistx.commands import execute, task
    from tfdistx.core.launch_mode import LaunchMode
    from tfdistx.core.run_spec import RunSpec

    spec = resolve(compose_ok(tmp_path / "run", "strategy=multiworker", "cluster=2x1"), str(tmp_path / "run"))
    command = execute._task_command(spec, "train", None)
    handed = typed_json.loads(RunSpec, (tmp_path / "run" / "logs" / "train-spec.json").read_text())
    assert command[-1] == str(tmp_path / "run" / "logs" / "train-spec.json")
    assert handed == execute.task_spec(spec) and handed.cluster.launch is LaunchMode.TF_CONFIG
    assert handed.config["cluster"]["launch"] == "tf_config" and handed.cluster.agent is None
    assert handed.layout.training_jobs() == spec.layout.training_jobs() == {"worker": 2}
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(inspect.getsource(task)))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert [name for name in imported if name.startswith(("omegaconf", "hydra", "tfdistx.config"))] == []
