"""cluster.launch=tf_config: one task of a cluster a scheduler placed, by the
TF_CONFIG it gave the process (Kubeflow's training operator in a TFJob's
pods, or by hand). Its job is the TFJob (launch/kubernetes.py).

A data.service's tasks and a sidecar evaluator listed in TF_CONFIG are
taken out of the cluster TensorFlow sees (cluster/data_service.py,
cluster/evaluator.py). No TensorFlow here.
"""

import json
from typing import Mapping

from tfdistx.cluster import data_service
from tfdistx.cluster.evaluator import EVALUATOR
from tfdistx.cluster.placement import Placement
from tfdistx.launch.base import Job, Launch
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout

ENV = "TF_CONFIG"


def from_tf_config(raw: str) -> Placement:
    try:
        config = json.loads(raw)
        cluster_spec, service = data_service.split(
            {job: list(addresses) for job, addresses in config["cluster"].items() if addresses and job != EVALUATOR}
        )  # not part of the cluster (cluster/evaluator.py)
        task = config["task"]
        return Placement(LaunchMode.TF_CONFIG, cluster_spec, task["type"], int(task.get("index", 0)), service)
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError.for_key(ENV, raw[:80], f"is not a TF_CONFIG with 'cluster' and 'task' ({error})") from None


class TfConfigLaunch(Launch):
    mode = LaunchMode.TF_CONFIG
    detect_order = 10  # first: whoever set TF_CONFIG meant it, whatever else placed the process
    jobs = (
        Job(
            "tfjob",
            "a Kubeflow TFJob (kubeflow.org/v1, the training operator)",
            "tfdistx.commands.kubernetes:tfjob",
        ),
    )

    def detected(self, env: Mapping[str, str]) -> bool:
        return bool(env.get(ENV))

    def place(self, layout: Layout, env: Mapping[str, str], training: bool) -> Placement:
        return from_tf_config(env.get(ENV, ""))


LAUNCH = TfConfigLaunch()
