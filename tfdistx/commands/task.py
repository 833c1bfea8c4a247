"""`tfdistx _task MODE RUN_DIR SPEC [STEP]`: one task of a local cluster
(or of a node's agent), started with its TF_CONFIG. It neither composes
nor resolves: it is handed the run spec its launcher resolved (typed JSON,
core/typed_json.py)."""

import json
import logging
import os
import sys

from pathlib import Path

from tfdistx.commands.common import one_line_errors
from tfdistx.commands.execute import execute_spec
from tfdistx.core import elastic, typed_json
from tfdistx.core.errors import EXIT_INTERRUPTED
from tfdistx.core.run_spec import RunSpec
from tfdistx.sigterm import SigtermNotice


def main(argv) -> int:
    mode, _run_dir, spec_path, *rest = argv  # the run dir is the spec's own
    # Plain messages: the launcher prefixes each line with the task's name
    # and files it in logs/<task>.log (as Hydra's job_logging=stdout did).
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    try:
        # From here a SIGTERM is a preemption, and Ctrl-C the user's stop (sigterm.py): the process's notice, which
        # cli.main opened first thing.
        with one_line_errors(), SigtermNotice() as notice:
            spec = typed_json.loads(RunSpec, Path(spec_path).read_text())  # placed by the launcher's TF_CONFIG
            if spec.cluster.elastic is not None:  # this round's workers: those its TF_CONFIG lists
                spec = elastic.for_round(spec, len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]))
            # The task's process ends with it (cli.end_process): its input pipelines need no teardown.
            execute_spec(
                spec,
                mode,
                int(rest[0]) if rest else None,
                process_ends_after=True,
                notice=notice if mode == "train" else None,
            )
    except KeyboardInterrupt:  # Ctrl-C reaches every task (launch.py): the launcher says "interrupted", once
        sys.exit(EXIT_INTERRUPTED)
    return 0
