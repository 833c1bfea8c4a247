"""Any Keras optimizer, and any learning-rate schedule, by name or by
`_target_` (engine/optim.py): the rates they follow and the keys they
refuse. In process, on real strategies (engine_helpers); that every Keras
optimizer resumes exactly is tests/test_optimizers.py."""

import pytest

from config_helpers import refused
from engine_helpers import train

pytestmark = pytest.mark.unit


def test_a_target_optimizer_and_schedule_with_warm_up_follow_their_rates(tmp_path):
    """optimizer._target_ with its own keys; a PiecewiseConstantDecay after
    10 steps of linear warm-up, scaled by the replicas: the logged rates are
    the schedule's."""
    schedule = (
        "optimizer.schedule={_target_:keras.optimizers.schedules.PiecewiseConstantDecay,"
        "boundaries:[20],values:[0.002,0.0005]}"
    )
    run = train(
        tmp_path / "run",
        "strategy=mirrored",
        "cluster=1x2",
        "optimizer._target_=keras.optimizers.Lion",
        "optimizer.beta_2=0.98",
        schedule,
        "optimizer.warmup_steps=10",
        "optimizer.scale_lr_with_replicas=true",
        "trainer.log_every=5",
        "trainer.steps_per_loop=5",
    )
    rates = {m["step"]: m["lr"] for m in run.metrics}
    # step s uses the schedule at s - 10 after the warm-up: 2 replicas x 0.002 until s - 10 > 20, then 2 x 0.0005
    assert rates[5] == pytest.approx(0.004 * 5 / 10) and rates[10] == pytest.approx(0.004)
    assert rates[30] == pytest.approx(0.004) and rates[35] == pytest.approx(0.001) and rates[40] == pytest.approx(0.001)
    assert run.summary["learning_rate"] == pytest.approx(0.004)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "optimizer.name=adamm",
            "optimizer.name='adamm': allowed: adadelta, adafactor, adagrad, adam, adamw, adamax, ftrl, lamb, lion, "
            "muon, nadam, rmsprop, schedulefreeadamw, sgd; or any class by optimizer._target_ (docs/own-project.md)",
        ),
        (
            "optimizer._target_=keras.optimizers.MultiOptimizer",
            "optimizer._target_='keras.optimizers.MultiOptimizer': not an optimizer tfdistx builds: its per-layer "
            "optimizers are objects you would build, each with its own learning rate, clipping and sum over replicas, "
            "which tfdistx sets on the one optimizer it builds (optimizer.lr, optimizer.schedule, "
            "optimizer.clip_norm): name one optimizer class, e.g. optimizer.name=adamw",
        ),
        (
            "optimizer._target_=keras.optimizers.OptimizerMap",
            "optimizer._target_='keras.optimizers.OptimizerMap': not an optimizer tfdistx builds: it is no optimizer "
            "but the mapping from variables to optimizers that MultiOptimizer takes, which tfdistx does not build "
            "either (one optimizer, its learning rate, clipping and sum over replicas set by tfdistx): name one "
            "optimizer class, e.g. optimizer.name=adamw",
        ),
        (
            "optimizer._target_=keras.optimizers.LossScaleOptimizer",
            "optimizer._target_='keras.optimizers.LossScaleOptimizer': not an optimizer tfdistx builds: it wraps "
            "another optimizer to scale the loss, which tfdistx does itself: name the optimizer and set "
            "trainer.precision=mixed_float16",
        ),
        ("+optimizer.clipnorm=1", "optimizer.clipnorm=1: tfdistx sets it: set optimizer.clip_norm"),
        (
            "+optimizer.gradient_accumulation_steps=4",
            "optimizer.gradient_accumulation_steps=4: tfdistx sets it: set trainer.accumulate_steps",
        ),
        (
            "optimizer.schedule=linear",
            "optimizer.schedule='linear': allowed: constant, cosine, warmup_cosine, or a mapping with the _target_ "
            "of a LearningRateSchedule",
        ),
    ],
)
def test_a_bad_optimizer_key_is_refused_before_tensorflow(tmp_path, override, message):
    assert any(message in line for line in refused(tmp_path, override)), refused(tmp_path, override)


def test_a_refused_optimizer_gets_no_note_about_the_keys_it_would_have_had(tmp_path, capsys):
    """The note on the default group's keys is for a run that goes ahead:
    before the refusal of the very name it is about, it is noise."""
    from tfdistx.commands.common import compose
    from tfdistx.core.errors import ConfigError

    for override in ("optimizer.name=adamm", "optimizer._target_=keras.optimizers.MultiOptimizer"):
        with pytest.raises(ConfigError):
            compose([override, f"hydra.run.dir={tmp_path}"])
        assert "note:" not in capsys.readouterr().err
    compose(["optimizer.name=lion", f"hydra.run.dir={tmp_path}"])  # accepted: the note is said
    assert "tfdistx: note: optimizer.name=lion gets only the optimizer keys you give" in capsys.readouterr().err


def test_a_multi_optimizer_named_by_another_path_is_refused_by_its_class(tmp_path):
    """keras.src's path is not known by name before TensorFlow
    starts: the engine refuses it by class, in the same words."""
    from tfdistx.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused_here:
        train(tmp_path / "run", "optimizer._target_=keras.src.optimizers.multi_optimizer.MultiOptimizer")
    assert "not an optimizer tfdistx builds: its per-layer optimizers are objects you would build" in str(
        refused_here.value
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["optimizer._target_=keras.optimizers.Lion", "optimizer.bta_2=0.9"],
            "optimizer.bta_2=0.9: keras.optimizers.Lion takes no such argument; it takes: beta_1, beta_2, "
            "weight_decay, clipvalue, use_ema, ema_momentum, ema_overwrite_frequency, name (tfdistx passes clipnorm, "
            "global_clipnorm, learning_rate itself)",
        ),
        (
            ["optimizer._target_=keras.layers.Dense"],
            "optimizer._target_='keras.layers.Dense': must name a keras.optimizers.Optimizer class, e.g. "
            "keras.optimizers.Lion",
        ),
        (
            [
                "optimizer.schedule={_target_:keras.optimizers.schedules.ExponentialDecay,"
                "initial_learning_rate:0.1,decay_step:10,decay_rate:0.5}"
            ],
            "optimizer.schedule.decay_step=10: keras.optimizers.schedules.ExponentialDecay takes no such argument",
        ),
        # the class it must be, by its public path (Keras defines it in keras.src)
        (
            ["optimizer.schedule={_target_:keras.optimizers.Adam}"],
            "optimizer.schedule._target_='keras.optimizers.Adam': returned a Adam; it must return a "
            "keras.optimizers.schedules.LearningRateSchedule",
        ),
    ],
)
def test_a_key_the_class_does_not_take_is_refused_naming_what_it_takes(tmp_path, overrides, message):
    from tfdistx.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        train(tmp_path / "run", *overrides)
    assert message in str(refused.value)


@pytest.mark.parametrize("schedule", ["NaNAfter", "NaNAfterOneByOne"])
def test_a_schedule_whose_rate_is_not_a_number_is_refused_and_the_work_before_kept(tmp_path, schedule):
    """Refused in one line naming the schedule and the first such step,
    before any step of it: a resumed run's checkpoint stays as it was."""
    from tfdistx.core.errors import ConfigError

    first = train(tmp_path / "run", "trainer.steps=10", "trainer.steps_per_loop=5", "trainer.log_every=5")
    before = first.weights()
    with pytest.raises(ConfigError) as refused_here:
        train(tmp_path / "run", "trainer.steps=20", f"optimizer.schedule={{_target_:user_plugins.{schedule},after:12}}")
    assert refused_here.value.lines() == [
        f"tfdistx: invalid config: optimizer.schedule._target_='user_plugins.{schedule}': its learning rate at step "
        "12 is nan: a schedule must give a finite rate at every step of the run (a rate that is not a number trains a "
        "model that is not one)"
    ]
    after = first.weights()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("ckpt-*.index")) == ["ckpt-10.index"]
    assert all((before[name] == after[name]).all() for name in before)


def test_every_class_of_keras_optimizers_is_built_or_refused_by_name_and_in_the_docs_table():
    """What passes --plan trains: every class the pinned Keras has in
    keras.optimizers is one tfdistx builds by its name, or one it refuses by
    name before TensorFlow starts; and docs/own-project.md's table says which."""
    import inspect
    from pathlib import Path

    import keras

    from tfdistx.core import optimizers

    classes = {f"keras.optimizers.{name}" for name, value in vars(keras.optimizers).items() if inspect.isclass(value)}
    known = set(optimizers.CLASSES.values()) | {
        path for path in optimizers.REFUSED if path.startswith("keras.optimizers.")
    }
    assert classes == known, classes ^ known
    page = (Path(__file__).resolve().parents[1] / "docs" / "own-project.md").read_text()
    table = page.split("Every class of `keras.optimizers`")[1].split("\n\n")[1]
    named = {name.strip(" `") for line in table.splitlines()[2:] for name in line.split("|")[1].split(",")}
    assert {path.rpartition(".")[2] for path in classes} == named
