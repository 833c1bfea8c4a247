"""The suite's layout: a unit test (-m unit: in-process and fast) lives in a
test_unit_*.py file, and such a file holds unit tests only. conftest.py
checks every test collected, before `-m` deselects any (layout_problems);
this file reports what it found, and that the rule says what it means,
in-process (-m unit)."""

import pytest

from conftest import LAYOUT_PROBLEMS, layout_problems


@pytest.mark.unit
def test_every_test_collected_keeps_the_layout(request):
    """The whole suite when it runs whole (`python -m pytest`, `-m unit`):
    each worker of pytest-xdist collects every test."""
    assert request.config.stash[LAYOUT_PROBLEMS] == [], "\n".join(request.config.stash[LAYOUT_PROBLEMS])


@pytest.mark.unit
def test_a_unit_test_outside_a_test_unit_file_and_any_other_test_inside_one_are_named():
    tests = [
        ("tests/test_unit_a.py::test_in_place", "test_unit_a.py", True),
        ("tests/test_b.py::test_in_place", "test_b.py", False),
        ("tests/test_b.py::test_unit_elsewhere", "test_b.py", True),
        ("tests/test_unit_a.py::test_slow_case[wide_deep]", "test_unit_a.py", False),
    ]
    assert layout_problems(tests) == [
        "tests/test_b.py::test_unit_elsewhere: marked unit, in a file not named test_unit_*.py",
        "tests/test_unit_a.py::test_slow_case[wide_deep]: not marked unit, in a test_unit_*.py file",
    ]


def _ruff(*args):
    """ruff from the test environment (the test extra installs it), on the whole checkout."""
    import subprocess
    import sys
    from pathlib import Path

    top = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=top, capture_output=True, text=True)


@pytest.mark.unit
def test_the_checkout_is_formatted_and_linted_as_pyproject_says():
    """`ruff format --check` and `ruff check` ([tool.ruff] in pyproject.toml): a change that is not
    formatted, or leaves an unused or undefined name, fails here, in the unit layer that .ci/run runs first."""
    formatted = _ruff("format", "--check", ".")
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    linted = _ruff("check", ".")
    assert linted.returncode == 0, linted.stdout + linted.stderr
