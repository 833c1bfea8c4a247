"""The command line itself, as a user starts it (real processes): its own
--help, and a bad config refused before TensorFlow is imported."""

import subprocess
import sys


def test_validation_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from tfdistx.cli import main\n"
        "try:\n    main(['data.batch_size=-1'])\n"
        "except SystemExit as e:\n    print(e.code, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out


def test_help_is_tfdistx_own_and_orients():
    run = subprocess.run([sys.executable, "-m", "tfdistx", "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    for must in (
        "strategy: auto, central_storage, mirrored, multiworker, one_device, parameter_server, tpu",
        "WxD",
        "psPwW",
        "tfdistx recipes",
        "tfdistx report",
        "--plan",
        "outputs/DATE/TIME",
        "== Examples ==",
    ):
        assert must in run.stdout, must
    assert "powered by Hydra" not in run.stdout
