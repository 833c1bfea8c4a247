"""The project's requirements, as pip selects them for each platform and
extra (read from pyproject.toml, nothing downloaded), in-process (-m unit).
The wheel built and installed: test_packaging.py."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# -- exactly one TensorFlow, whatever the platform and extras ----------------------

PLATFORMS = {  # the markers pip evaluates, as each platform reports them
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"},
    "windows-amd64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64"},
}


def selected(extras, platform) -> list:
    """The project's requirements pip selects for `extras` on `platform` (no download)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    chosen = []
    for extra in ["", *extras]:
        lines = project["dependencies"] if not extra else project["optional-dependencies"][extra]
        env = {
            "python_version": "3.11",
            "python_full_version": "3.11.7",
            "os_name": "posix",
            "implementation_name": "cpython",
            **PLATFORMS[platform],
            "extra": extra,
        }
        chosen += [r for r in map(Requirement, lines) if r.marker is None or r.marker.evaluate(env)]
    return chosen


@pytest.mark.unit
@pytest.mark.parametrize("platform", list(PLATFORMS))
@pytest.mark.parametrize("extras", [[], ["gpu"], ["test"], ["gpu", "test", "sweep"]])
def test_every_install_selects_exactly_one_tensorflow(extras, platform):
    from tfdistx.machine import TENSORFLOW_DISTRIBUTIONS

    tensorflows = {r.name for r in selected(extras, platform) if r.name in TENSORFLOW_DISTRIBUTIONS}
    assert tensorflows == {"tensorflow"}, (extras, platform, tensorflows)


@pytest.mark.unit
@pytest.mark.parametrize("platform, cuda", [("linux-x86_64", True), ("linux-aarch64", True), ("macos-arm64", False)])
def test_the_gpu_extra_adds_the_cuda_libraries_to_the_same_tensorflow(platform, cuda):
    tensorflow = [r for r in selected(["gpu"], platform) if r.name == "tensorflow"]
    assert {str(r.specifier) for r in tensorflow} == {"==2.21.0"}  # one version, whichever line asks
    assert any("and-cuda" in r.extras for r in tensorflow) is cuda
