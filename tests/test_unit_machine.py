"""What this machine has for TensorFlow (tfdistx/machine.py), in-process:
the TensorFlow distributions installed (read from real dist-info metadata,
some of it written to tmp_path and put on sys.path), NVIDIA GPUs (a driver's
/proc and /dev entries, laid out in tmp_path), and the one-line warnings a
run prints about them. The marker test that pip selects one TensorFlow is
in test_packaging.py."""

import pytest

from tfdistx import machine

pytestmark = pytest.mark.unit

INSTALLED = machine.tensorflow_distributions()  # this venv's: one of them, whichever pyproject.toml selected here


def installed_beside(tmp_path, monkeypatch, name: str, version: str):
    """A distribution's metadata as pip leaves it, on sys.path."""
    info = tmp_path / "site" / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_this_environment_has_exactly_one_tensorflow():
    assert len(INSTALLED) == 1, INSTALLED
    assert machine.conflict() is None


def test_a_second_tensorflow_is_named_with_the_fix(tmp_path, monkeypatch):
    installed_beside(tmp_path, monkeypatch, "tensorflow-gpu", "2.0.0")
    line = machine.conflict()
    ((name, version),) = INSTALLED.items()
    assert line.startswith(
        f"{name} {version}, tensorflow-gpu 2.0.0 are installed together: they write the same tensorflow/ files"
    ), line
    assert line.endswith(
        f"pip uninstall -y {name} tensorflow-gpu, then reinstall tfdistx (on a GPU machine: {machine.GPU_INSTALL})"
    )


@pytest.mark.parametrize(
    "proc, dev, count",
    [
        ([], [], 0),
        (["0000:3b:00.0", "0000:5e:00.0"], ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"], 2),
        ([], ["nvidia0", "nvidiactl"], 1),  # a container given the device without the driver's /proc
    ],
)
def test_nvidia_gpus_are_counted_from_the_drivers_entries(tmp_path, proc, dev, count):
    (tmp_path / "proc").mkdir()
    (tmp_path / "dev").mkdir()
    for name in proc:
        (tmp_path / "proc" / name).mkdir()
    for name in dev:
        (tmp_path / "dev" / name).write_text("")
    assert machine.nvidia_gpus(str(tmp_path / "proc"), str(tmp_path / "dev")) == count


def test_a_machine_without_a_driver_has_no_gpus(tmp_path):
    assert machine.nvidia_gpus(str(tmp_path / "no-proc"), str(tmp_path / "no-dev")) == 0


@pytest.mark.parametrize(
    "sees, cuda, gpus, environ, says",
    [
        (
            False,
            False,
            4,
            {},
            "this machine has 4 NVIDIA GPU(s) but TensorFlow sees none, so this run trains on the CPU: ",
        ),
        (False, False, 4, {}, " has no CUDA kernels: pip install 'tfdistx[gpu]'"),
        (False, True, 2, {}, "TensorFlow found no CUDA libraries (the gpu extra installs them from pip)"),
        (True, True, 4, {}, None),  # it sees them
        (False, True, 0, {}, None),  # nothing to see
        (False, True, 4, {"CUDA_VISIBLE_DEVICES": ""}, None),  # hidden on purpose
        (False, True, 4, {"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ],
)
def test_gpus_tensorflow_does_not_see_are_one_line_with_the_fix(sees, cuda, gpus, environ, says):
    line = machine.unseen_gpus(sees, cuda, gpus=gpus, environ=environ)
    if says is None:
        assert line is None
    else:
        assert says in line and "\n" not in line, line


@pytest.mark.parametrize(
    "gpus, environ, says",
    [
        (0, {}, "no NVIDIA GPU on this machine: replicas run on CPU devices; "),
        (
            8,
            {"CUDA_VISIBLE_DEVICES": "-1"},
            "8 NVIDIA GPU(s) on this machine, hidden by CUDA_VISIBLE_DEVICES='-1': replicas run on CPU devices",
        ),
        (8, {}, "8 NVIDIA GPU(s) on this machine; "),
    ],
)
def test_plan_names_the_gpus_and_the_tensorflow_that_would_use_them(gpus, environ, says):
    line = machine.describe(gpus=gpus, environ=environ)
    ((name, version),) = INSTALLED.items()
    assert line.startswith(says) and f"{name} {version}" in line, line
