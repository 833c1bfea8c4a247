"""What this machine has for TensorFlow, found without importing it: the
TensorFlow distributions pip installed, the NVIDIA GPUs its driver shows,
and whether the CUDA libraries of the `gpu` extra are there.

`--plan` prints it (its `devices` line), and a run warns in one line, with
the fix, when the install cannot be right: two TensorFlow distributions
(they write the same `tensorflow/` files, so which one runs is whichever pip
installed last), or GPUs on the machine that TensorFlow does not see. No
TensorFlow and no Hydra here: config code, commands and the engine all ask.
"""

import os
import re
from importlib import metadata
from typing import Dict, Optional

# Distributions that install the `tensorflow` module itself. tfdistx asks
# for `tensorflow` alone (pyproject.toml); the rest arrive from elsewhere
# (an older tfdistx asked for tensorflow-cpu, some images ship their own).
TENSORFLOW_DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-gpu",
    "tensorflow-macos",
    "tf-nightly",
    "tf-nightly-cpu",
)
# Without a GPU in TensorFlow's wheel, whatever the machine has.
CPU_ONLY = ("tensorflow-cpu", "tf-nightly-cpu")
# Two of the CUDA libraries `tensorflow[and-cuda]` (the `gpu` extra) installs from pip.
CUDA_FROM_PIP = ("nvidia-cudnn-cu12", "nvidia-cublas-cu12")

GPU_INSTALL = "pip install 'tfdistx[gpu]' (from a checkout: pip install -e '.[gpu]')"


def tensorflow_distributions() -> Dict[str, str]:
    """The installed distributions that provide the `tensorflow` module: name -> version."""
    found = {}
    for name in TENSORFLOW_DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def cuda_from_pip() -> bool:
    """The `gpu` extra's CUDA libraries are installed (else TensorFlow needs the system's)."""
    for name in CUDA_FROM_PIP:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            return False
    return True


def nvidia_gpus(proc: str = "/proc/driver/nvidia/gpus", dev: str = "/dev") -> int:
    """NVIDIA GPUs the loaded driver shows (one /proc entry or /dev/nvidiaN node each); 0 without a driver."""
    listed = len(os.listdir(proc)) if os.path.isdir(proc) else 0
    nodes = len([n for n in os.listdir(dev) if re.fullmatch(r"nvidia\d+", n)]) if os.path.isdir(dev) else 0
    return max(listed, nodes)


def hidden_by_environment(environ=os.environ) -> bool:
    """CUDA_VISIBLE_DEVICES hides every GPU: the user chose the CPU."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip() in ("", "-1")


def conflict() -> Optional[str]:
    """One line when two TensorFlow distributions are installed, with the fix; else None."""
    found = tensorflow_distributions()
    if len(found) < 2:
        return None
    names = " ".join(found)
    listed = ", ".join(f"{name} {version}" for name, version in found.items())
    return (
        f"{listed} are installed together: they write the same tensorflow/ files, so the one that runs is whichever "
        f"pip installed last: pip uninstall -y {names}, then reinstall tfdistx (on a GPU machine: {GPU_INSTALL})"
    )


def unseen_gpus(
    tensorflow_sees_gpus: bool, built_with_cuda: bool, gpus: Optional[int] = None, environ=os.environ
) -> Optional[str]:
    """One line when the machine has NVIDIA GPUs (`gpus`: found here) that
    TensorFlow does not see, so the run trains on the CPU, with the fix."""
    gpus = nvidia_gpus() if gpus is None else gpus
    if tensorflow_sees_gpus or not gpus or hidden_by_environment(environ):
        return None
    if not built_with_cuda:
        why = f"{', '.join(tensorflow_distributions()) or 'the installed TensorFlow'} has no CUDA kernels"
    elif not cuda_from_pip():
        why = "TensorFlow found no CUDA libraries (the gpu extra installs them from pip)"
    else:
        why = (
            "TensorFlow could not use them (its log at TF_CPP_MIN_LOG_LEVEL=0 says why: driver version, "
            "CUDA_VISIBLE_DEVICES)"
        )
    return (
        f"this machine has {gpus} NVIDIA GPU(s) but TensorFlow sees none, so this run trains on the CPU: {why}: "
        f"{GPU_INSTALL}"
    )


def describe(gpus: Optional[int] = None, environ=os.environ) -> str:
    """--plan's `devices` line: the GPUs here (`gpus`: found here) and the TensorFlow that would use them."""
    found = tensorflow_distributions()
    tensorflow = ", ".join(f"{name} {version}" for name, version in found.items()) or "no TensorFlow installed"
    gpus = nvidia_gpus() if gpus is None else gpus
    if not gpus:
        return f"no NVIDIA GPU on this machine: replicas run on CPU devices; {tensorflow}"
    text = f"{gpus} NVIDIA GPU(s) on this machine"
    if hidden_by_environment(environ):
        return (
            f"{text}, hidden by CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r}: replicas run on CPU "
            f"devices; {tensorflow}"
        )
    if not found or set(found) <= set(CPU_ONLY):
        return f"{text}; {tensorflow} has no CUDA kernels: the run would train on the CPU: {GPU_INSTALL}"
    libraries = (
        "CUDA libraries from pip (the gpu extra)"
        if cuda_from_pip()
        else "no CUDA libraries from pip: the system's are used, if any"
    )
    return f"{text}; {tensorflow}, {libraries}"
