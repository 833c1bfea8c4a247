"""`strategy.partitioner` (parameter servers), its config in-process (-m
unit): off by default, its keys and shorthand refused in one line, and the
bytes --plan shows on each ps. Trained on real clusters: test_partitioner.py."""

import pytest

from config_helpers import compose_ok, refused
from tfdistx.commands import plan
from tfdistx.core import strategies

SPLIT = ["strategy=parameter_server", "strategy.partitioner.min_shard_bytes=65536", "strategy.partitioner.max_shards=2"]


@pytest.mark.unit
def test_the_partitioner_is_off_by_default_and_on_with_a_key_or_true(tmp_path):
    def settings(*overrides):
        cfg = compose_ok(tmp_path / "run", "strategy=parameter_server", "cluster=ps2w2", *overrides)
        return strategies.partitioner_settings(cfg.strategy.partitioner, cfg.cluster.ps)

    assert settings() is None
    assert settings("strategy.partitioner=false") is None
    assert settings("strategy.partitioner=true") == {"min_shard_bytes": 262144, "max_shards": 2}
    assert settings("strategy.partitioner.min_shard_bytes=1024") == {"min_shard_bytes": 1024, "max_shards": 2}
    assert settings("strategy.partitioner.max_shards=4") == {"min_shard_bytes": 262144, "max_shards": 4}


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, key, allowed",
    [
        (
            "strategy.partitioner.max_shards=0",
            "strategy.partitioner.max_shards=0",
            "a whole number of shards, at least 1",
        ),
        (
            "strategy.partitioner.min_shard_bytes=abc",
            "strategy.partitioner.min_shard_bytes='abc'",
            "a whole number of bytes",
        ),
        ("strategy.partitioner.min_shard_bytes=-5", "strategy.partitioner.min_shard_bytes=-5", "at least 1"),
        (
            "strategy.partitioner=7",
            "strategy.partitioner=7",
            "true (256 KiB shards, one per ps), false/null (off), or {min_shard_bytes",
        ),
        (
            "+strategy.partitioner.shards=2",
            "strategy.partitioner.shards=2",
            "strategy.partitioner takes min_shard_bytes, max_shards",
        ),
    ],
)
def test_a_bad_partitioner_value_is_refused_in_one_line(tmp_path, override, key, allowed):
    lines = refused(tmp_path / "run", "strategy=parameter_server", "cluster=ps2w2", override)
    assert len(lines) == 1 and key in lines[0] and allowed in lines[0], lines


@pytest.mark.unit
@pytest.mark.parametrize(
    "strategy",
    [
        ["strategy=multiworker", "cluster=2x1", "strategy.partitioner.max_shards=2"],
        ["strategy=multiworker", "cluster=2x1", "strategy.partitioner=true"],
        ["strategy=mirrored", "+strategy.partitioner=true"],
    ],
)
def test_the_partitioner_under_another_strategy_is_refused_in_one_line(tmp_path, strategy):
    lines = refused(tmp_path / "run", *strategy)
    assert len(lines) == 1 and "strategy.partitioner" in lines[0] and "is for strategy=parameter_server" in lines[0], (
        lines
    )


@pytest.mark.unit
def test_plan_shows_the_bytes_on_each_ps(tmp_path):
    cfg = compose_ok(tmp_path / "run", *SPLIT, "cluster=ps2w2")
    text = plan.describe(cfg)
    assert "per ps: 201,256 / 205,824 (largest 50.6%); unsplit: 406,528 / 552 (largest 99.9%)" in text, text
    off = plan.describe(compose_ok(tmp_path / "run", "strategy=parameter_server", "cluster=ps2w2"))
    assert "variables     whole, round-robin over 2 ps" in off and "per ps: 406,528 / 552" in off, off


@pytest.mark.unit
def test_a_key_after_the_shorthand_says_to_drop_the_shorthand(tmp_path):
    lines = refused(
        tmp_path / "run",
        "strategy=parameter_server",
        "cluster=ps2w2",
        "strategy.partitioner=true",
        "strategy.partitioner.max_shards=3",
    )
    assert lines == [
        "tfdistx: invalid config: strategy.partitioner.max_shards='3': strategy.partitioner is true here, not a "
        "mapping of keys: set strategy.partitioner.KEY=VALUE without strategy.partitioner=true"
    ], lines
