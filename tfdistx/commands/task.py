"""`tfdistx _task MODE RUN_DIR CONFIG [STEP]`: one task of a local cluster,
started by the launcher with its TF_CONFIG. It does not compose: it reads
the launcher's resolved config."""

import json
import logging
import os
import sys

from omegaconf import OmegaConf

from tfdistx.commands.common import one_line_errors
from tfdistx.commands.execute import execute
from tfdistx.spec import elastic
from tfdistx.spec.errors import EXIT_INTERRUPTED
from tfdistx.sigterm import SigtermNotice


def main(argv) -> int:
    mode, run_dir, config_path, *rest = argv
    # Plain messages: the launcher prefixes each line with the task's name
    # and files it in logs/<task>.log (as Hydra's job_logging=stdout did).
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    try:
        # From here a SIGTERM is a preemption, and Ctrl-C the user's stop (sigterm.py): the process's notice, which
        # cli.main opened first thing.
        with one_line_errors(), SigtermNotice() as notice:
            cfg = OmegaConf.load(config_path)  # cluster.launch=tf_config: placed by the launcher's TF_CONFIG
            if elastic.is_elastic(
                cfg.cluster
            ):  # this round's workers are those its TF_CONFIG lists (launch/local/elastic.py)
                elastic.for_round(cfg.cluster, len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]))
            # The task's process ends with it (cli.end_process): its input pipelines need no teardown.
            execute(
                cfg,
                run_dir,
                mode,
                int(rest[0]) if rest else None,
                process_ends_after=True,
                notice=notice if mode == "train" else None,
            )
    except KeyboardInterrupt:  # Ctrl-C reaches every task (launch.py): the launcher says "interrupted", once
        sys.exit(EXIT_INTERRUPTED)
    return 0
