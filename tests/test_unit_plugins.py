"""Each plug-in declared once (issue 33): a strategy is its row of
core/strategies.py (and its builder), a task its class and its YAML, a
data source its function and its YAML; the config side reads those facts
and still refuses bad input in one line before TensorFlow starts."""

import pytest
from omegaconf import OmegaConf

from config_helpers import PREFIX, compose_ok, refused
from tfdistx.config import userconf
from tfdistx.core import strategies

pytestmark = pytest.mark.unit

# a cluster each strategy can run on
FITS = {"multiworker": ["cluster=2x1"], "parameter_server": ["cluster=ps1w2"]}


# -- strategies: a row of the table is the `strategy=NAME` option --------------------


@pytest.mark.parametrize("name", strategies.NAMES)
def test_each_strategy_composes_as_its_row_says(tmp_path, name):
    cfg = compose_ok(tmp_path / "run", f"strategy={name}", *FITS.get(name, []))
    assert OmegaConf.to_container(cfg.strategy) == strategies.nodes()[name]


def test_every_option_a_row_declares_composes_and_is_checked(tmp_path):
    """An option's key is in the composed group (so `strategy.KEY=V` needs
    no `+`), and a value outside its allowed ones is refused in one line."""
    cfg = compose_ok(tmp_path / "run", "strategy=mirrored", "strategy.cross_device_ops=reduction_to_one")
    assert cfg.strategy.cross_device_ops == "reduction_to_one"
    assert refused(
        tmp_path / "run", "strategy=multiworker", "cluster=2x1", "strategy.communication=carrier_pigeon"
    ) == [PREFIX + "strategy.communication='carrier_pigeon': allowed: auto, ring, nccl, mpi"]


@pytest.fixture
def own_conf(tmp_path, monkeypatch):
    monkeypatch.setenv(userconf.ENV, "")  # recorded, so the test's own value is undone after it
    root = tmp_path / "conf"
    (root / "strategy").mkdir(parents=True)
    monkeypatch.setenv(userconf.ENV, str(root))
    return root / "strategy"


def test_a_users_strategy_file_named_like_a_row_is_refused(own_conf, tmp_path):
    """The rows are options though no file holds them: a user's
    strategy/mirrored.yaml would replace one in every run, as a user's
    model/mlp.yaml would."""
    shadow = own_conf / "mirrored.yaml"
    shadow.write_text("name: mirrored\ncross_device_ops: nccl\n")
    assert refused(tmp_path / "run", "trainer.steps=5") == [
        PREFIX
        + f"--config-dir (TFDISTX_CONFIG_PATH)={str(shadow)!r}: has the name of the shipped option strategy=mirrored, "
        "which it would replace in every run: rename it, e.g. strategy/my_mirrored.yaml (and pick it with "
        "strategy=my_mirrored)"
    ]
    assert [o["refused"] is not None for o in userconf.options()["strategy"]] == [True]


def test_a_users_own_strategy_option_composes(own_conf, tmp_path):
    (own_conf / "reduced.yaml").write_text(
        "name: mirrored\ncross_device_ops: reduction_to_one\nall_reduce_dtype: bfloat16\n"
    )
    cfg = compose_ok(tmp_path / "run", "strategy=reduced", "cluster=1x2")
    assert OmegaConf.to_container(cfg.strategy) == {
        "name": "mirrored",
        "cross_device_ops": "reduction_to_one",
        "all_reduce_dtype": "bfloat16",
    }


# -- tasks: the class and its YAML, which says what the config side checks --------------


def test_a_tasks_yaml_says_what_task_metrics_may_name(own_conf, tmp_path):
    """The check before TensorFlow reads the option's `offers`, whatever the class."""
    tasks = own_conf.parent / "task"
    tasks.mkdir()
    (tasks / "ctr.yaml").write_text(
        "_target_: tfdistx.tasks.binary.Binary\nname: ctr\nmetrics: [auc]\noffers: [auc]\n"
        "auc_thresholds: 200\nobjective: eval/auc\n"
    )
    assert compose_ok(tmp_path / "run", "task=ctr").task.offers == ["auc"]
    assert refused(tmp_path / "run", "task=ctr", "task.metrics=[auc,accuracy]", "task.auc_thresholds=2") == [
        PREFIX + "task.metrics=['auc', 'accuracy']: task=ctr offers auc",
        PREFIX + "task.auc_thresholds=2: must be a whole number, at least 3",
    ]


def test_a_task_target_of_the_command_line_gets_none_of_the_options_facts(tmp_path, capsys):
    """`task=binary task._target_=mine.Task`: binary's `offers` and `labels`
    are not that task's, so they go (unsaid: they are no keys it takes), and
    the task checks its metrics once built."""
    from tfdistx.commands.common import compose

    cfg = compose(
        [
            "task=binary",
            "task._target_=user_plugins.SquaredHinge",
            "trainer.objective=eval/margin_accuracy",
            f"hydra.run.dir={tmp_path / 'run'}",
        ]
    )
    assert sorted(cfg.task) == ["_target_", "name", "objective"]
    assert "(not the default group's metrics, auc_thresholds)" in capsys.readouterr().err


def test_what_a_task_declares_is_not_passed_to_its_class(tmp_path):
    from tfdistx.config.resolve import resolve

    spec = resolve(compose_ok(tmp_path / "run", "task=binary"), str(tmp_path / "run"))
    assert dict(spec.task.kwargs) == {"metrics": ["auc", "accuracy", "log_loss"], "auc_thresholds": 200}


# -- data sources: the function and its YAML, whose keys say what is checked ----------------


@pytest.mark.parametrize(
    "option, checks, plan_line, eval_key, labels",
    [
        ("synthetic", "size_problems", None, None, None),
        ("synthetic_categorical", "size_problems", None, None, None),
        ("synthetic_multilabel", "size_problems", None, None, None),
        ("synthetic_regression", "size_problems", None, None, "real values"),
        ("mnist", "named_problems", None, "eval_split", None),
        ("tfds", "named_problems", None, "eval_split", None),
        ("tfrecord", "file_problems", "files_plan", "eval_files", None),
        ("csv", "file_problems", "files_plan", "eval_files", None),
    ],
)
def test_each_shipped_source_gets_the_checks_its_keys_call_for(tmp_path, option, checks, plan_line, eval_key, labels):
    from tfdistx.config import sources

    files = ["data.train_files=gs://bucket/train-*"] if option in ("tfrecord", "csv") else []
    files += ["data.name=imdb_reviews"] if option == "tfds" else []  # data=tfds names its dataset
    task = ["task=regression"] if option == "synthetic_regression" else []
    row = sources.of(compose_ok(tmp_path / "run", f"data={option}", *files, *task).data)
    assert (row.checks.__name__, getattr(row.plan_line, "__name__", None), row.eval_key, row.labels) == (
        checks,
        plan_line,
        eval_key,
        labels,
    )


def test_a_users_own_source_gets_no_checks_of_the_built_in_ones(tmp_path):
    from tfdistx.config import sources

    # a file source's key, which a built-in file source would check: here it is only the user's function's (**kwargs)
    cfg = compose_ok(
        tmp_path / "run",
        "data._target_=user_plugins.two_classes_by_default",
        "data.num_classes=1",
        "data.train_files=nope",
    )
    assert sources.of(cfg.data) == sources.Source()


# -- loggers: a built-in logger is one class of tfdistx/loggers/ and one YAML file (issue 44) --------------------


def test_each_built_in_logger_is_a_class_and_its_yaml_shows_its_keys_and_defaults():
    """Every built-in logger has its YAML: its own conf/logger/NAME.yaml, or default.yaml for those on by default
    (and default.yaml names no other). A YAML's keys are the class's, at the class's defaults; found without
    TensorFlow."""
    import sys

    from tfdistx import loggers
    from tfdistx.core.paths import config_dir
    from tfdistx.core.targets import locate

    had_tensorflow = "tensorflow" in sys.modules
    found = loggers.built_in()
    assert [row.name for row in found] == ["console", "tensorboard", "csv", "mlflow", "wandb"]
    assert had_tensorflow or "tensorflow" not in sys.modules
    default = OmegaConf.to_container(OmegaConf.load(config_dir() / "logger" / "default.yaml"))
    assert default == {row.name: True for row in found if row.on}
    for row in found:
        assert locate(row.target()) == row.maker(), row.name
        assert set(row.seconds) <= set(row.keys() or ()), row.name
        if row.on:
            continue
        own = OmegaConf.to_container(OmegaConf.load(config_dir() / "logger" / f"{row.name}.yaml"))
        if row.keys() is None:
            assert own == {row.name: True}
        else:
            keys = dict(own[row.name])
            assert keys.pop("enabled") is True
            assert {key: tuple(v) if isinstance(v, list) else v for key, v in keys.items()} == dict(row.keys()), (
                row.name
            )


LINES_LOGGER = """
from tfdistx.loggers import BuiltInLogger


class LinesLogger(BuiltInLogger):
    \"\"\"A line per record in <run dir>/NAME.\"\"\"

    name, files = "lines", ("lines.txt",)

    def __init__(self, run_dir, name: str = "lines.txt"):
        self.file = open(f"{run_dir}/{name}", "a")

    @classmethod
    def shown(cls, keys):
        return f"lines ({keys['name']})"

    def __call__(self, step, metrics):
        self.file.write(f"{step} {metrics['loss']}\\n")

    def close(self):
        self.file.close()
"""


@pytest.fixture
def one_more_logger_module(tmp_path, monkeypatch):
    """A module of one more built-in logger beside tfdistx/loggers/' own (the package's path is a list:
    the module is found there as `tfdistx.loggers.lines`, as a file put in the package would be)."""
    import sys

    from tfdistx import loggers

    (tmp_path / "package").mkdir()
    (tmp_path / "package" / "lines.py").write_text(LINES_LOGGER)
    monkeypatch.setattr(loggers, "__path__", [*loggers.__path__, str(tmp_path / "package")])
    loggers.built_in.cache_clear()
    yield
    sys.modules.pop("tfdistx.loggers.lines", None)
    monkeypatch.undo()
    loggers.built_in.cache_clear()


def test_a_new_built_in_logger_is_one_class(tmp_path, one_more_logger_module):
    """A class added to the package is composed with its keys (no YAML needed to set them), checked,
    shown by --plan, and opened by the engine's for_run."""
    from tfdistx.commands.plan import _loggers
    from tfdistx.config.resolve import resolve
    from tfdistx.engine.loggers import for_run

    off = ["logger.console=false", "logger.tensorboard=false"]
    assert refused(tmp_path / "bad", *off, "logger.lines.enabled=true", "logger.lines.nam=x") == [
        f"{PREFIX}logger.lines.nam='x': logger.lines has no such key; its keys: enabled, name"
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = resolve(compose_ok(run_dir, *off, "logger.lines.enabled=true", "logger.lines.name=mine.txt"), str(run_dir))
    assert _loggers(spec.logger) == ["metrics.jsonl", "lines (mine.txt)"]
    with for_run(run_dir, spec.logger, total_steps=10, start_step=0) as sinks:
        assert [sink.key for sink in sinks] == ["metrics.jsonl", "logger.lines"]
        for sink in sinks:
            sink(5, {"loss": 0.5})
    assert (run_dir / "mine.txt").read_text() == "5 0.5\n"


def test_a_logger_entry_that_is_neither_built_in_nor_the_users_is_refused_in_one_line(tmp_path):
    """`logger.foo.bar=1` (no _target_) would do nothing; it is refused, naming the loggers there are."""
    assert refused(tmp_path / "run", "logger.foo.bar=1") == [
        f"{PREFIX}logger.foo='{{...}}': no such logger; the built-in: console, tensorboard, csv, mlflow, wandb; "
        "or your own: logger.foo._target_=your.Logger"
    ]


def test_a_built_in_logger_off_by_default_is_set_by_its_key_beside_any_option(tmp_path):
    """default.yaml names only the loggers on by default; logger.csv=true
    and logger.console=false still compose, with any option."""
    from tfdistx.commands.plan import _loggers
    from tfdistx.config.resolve import resolve

    spec = resolve(
        compose_ok(tmp_path / "run", "logger=csv", "logger.console=false", "logger.wandb.enabled=true"),
        str(tmp_path / "run"),
    )
    assert _loggers(spec.logger) == ["metrics.jsonl", "tensorboard", "metrics.csv", "wandb"]
    assert dict(spec.logger.on["wandb"].kwargs) == {
        "project": "tfdistx",
        "entity": None,
        "mode": None,
        "group": None,  # a single run: no group
        "name": "run",  # a single run: named by its run dir (config/resolve.job_names)
        "job_type": "train",
        "notes": None,
        "tags": (),
        "log_model": False,
        "init_timeout": 30.0,
    }
    assert spec.config["logger"]["wandb"]["name"] == "run"  # in the resolved config a cluster's tasks read
