"""`tfdistx job tfjob|jobset|trainjob [overrides] --image IMAGE`: the
composed config as Kubernetes manifests, printed as YAML: a Kubeflow TFJob
(launch/kubernetes.py), a JobSet, or a Kubeflow Trainer v2 TrainJob with
its ClusterTrainingRuntime (launch/jobset.py). One command line
for all three: the manifests differ, the run they describe does not."""

import argparse
import os
import sys
from pathlib import Path
from typing import Optional


from tfdistx import emit
from tfdistx import launch as launches
from tfdistx.launch import jobset as jobset_manifest
from tfdistx.launch import kubernetes
from tfdistx.launch.jobset import check_name
from tfdistx.launch.kubernetes import DEFAULT_MOUNT_PATH, PodOptions, check_image, check_mount_path
from tfdistx.commands.common import compose_as_placed, one_line_errors
from tfdistx.config import userconf
from tfdistx.config.compose import code_the_image_must_have
from tfdistx.core import elastic
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode

# kind -> (the builder, returning one manifest or a list; the longest --name; the cluster.launch its pods run with,
# when they need placing). What each prints is its launch's Job (tfdistx/launch/).
KINDS = {
    "tfjob": (kubernetes.tfjob, kubernetes.MAX_NAME, LaunchMode.TF_CONFIG),
    "jobset": (jobset_manifest.jobset_and_network_policy, jobset_manifest.MAX_NAME, LaunchMode.JOBSET),
    "trainjob": (jobset_manifest.trainjob_manifests, jobset_manifest.MAX_NAME, LaunchMode.JOBSET),
}


def tfjob(argv) -> int:
    return write(argv, "tfjob")


def jobset(argv) -> int:
    return write(argv, "jobset")


def trainjob(argv) -> int:
    return write(argv, "trainjob")


def write(argv, kind: str) -> int:
    build, longest, pods_launch = KINDS[kind]
    what = launches.jobs()[kind].what
    parser = argparse.ArgumentParser(
        prog=f"tfdistx job {kind}",
        description=(
            f"Print {what} whose pods run `python -m tfdistx OVERRIDES`: kubectl apply -f it. See docs/clusters.md."
        ),
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as for a run: strategy=multiworker cluster=4x8")
    parser.add_argument("--image", required=True, help="a container image with tfdistx installed (docs/clusters.md)")
    parser.add_argument(
        "--name", default="tfdistx", help=f"the {kind}'s name (default: tfdistx); also the run dir's on the volume"
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument(
        "--volume",
        help="where the run dir lives, shared by the pods: pvc:CLAIM or hostPath:/PATH. "
        "Without it each pod writes its own, lost with the pod",
    )
    parser.add_argument(
        "--mount-path", default=DEFAULT_MOUNT_PATH, help=f"where the volume is mounted (default: {DEFAULT_MOUNT_PATH})"
    )
    parser.add_argument(
        "--gpus",
        action="store_true",
        help="each training pod asks for cluster.devices_per_worker GPUs (nvidia.com/gpu)",
    )
    parser.add_argument(
        "--config-dir",
        help="your config dir (docs/own-project.md), given to the pods as it is given here: "
        "the image or the volume must hold it at that path (repeatable)",
    )
    config_path = os.environ.get(userconf.ENV) or None  # as the user set it, for the pods' environment
    with one_line_errors():
        rest, config_dirs = userconf.split_flags(argv)
        args = parser.parse_intermixed_args(rest)
        userconf.add([Path(d) for d in config_dirs])  # this command composes with them too
        check_name("--name", args.name, longest)
        check_name("--namespace", args.namespace, 63)
        check_image("--image", args.image)
        mount_path = check_mount_path("--mount-path", args.mount_path)
        overrides = elastic.expand_shorthand(args.overrides)
        # Under agents the JobSet names the rendezvous (its first pod): checked here with a stand-in, unless given.
        given = {override.lstrip("+").partition("=")[0] for override in overrides}
        stand_in = [] if "cluster.agent.store" in given else ["cluster.agent.store=first-pod:1"]

        def launch_of(
            layout,
        ) -> Optional[LaunchMode]:  # the pods' cluster.launch (Pods.args, jobset_manifest: the same rule)
            if layout.cluster.agent is not None:
                return None  # cluster.launch=agent, as composed
            return pods_launch if kubernetes.needs_placing(layout) else None

        cfg, layout = compose_as_placed([*overrides, *stand_in], launch_of, pods_launch)  # what the manifests read
        if layout.cluster.agent is not None and kind != "jobset":
            raise ConfigError.for_key(
                "cluster.launch",
                LaunchMode.AGENT,
                f"an agent on every node runs as a JobSet: tfdistx job jobset "
                f"(a {kind}'s controller places and restarts the tasks itself)",
            )
        options = PodOptions(
            tuple(args.overrides),
            args.name,
            args.image,
            args.namespace,
            args.volume,
            mount_path,
            args.gpus,
            config_dirs=tuple(config_dirs),
            config_path=config_path,
        )
        manifests = build(layout, options)
    if not args.volume:
        print(
            "tfdistx: WARNING: no --volume: each pod writes its run dir inside itself, and a restarted pod loses "
            "its checkpoints: give --volume pvc:CLAIM",
            file=sys.stderr,
        )
    carried = userconf.carried(config_dirs, config_path)
    if carried:  # this machine's directories: the pods read theirs
        print(
            f"tfdistx: WARNING: the pods compose with {' and '.join(carried)}: the image (or the volume) must hold "
            "each of these directories at that path, relative to the pod's working directory",
            file=sys.stderr,
        )
    imported = code_the_image_must_have(cfg)
    if imported:  # composing in the pod finds the config; building the run imports these
        print(
            f"tfdistx: WARNING: the pods import {', '.join(f'{m} ({k})' for m, k in imported.items())}, which tfdistx "
            "does not install: the image must have each (installed, or on the pods' PYTHONPATH)",
            file=sys.stderr,
        )
    made_by = emit.command_line(["tfdistx", "job", kind, *argv])  # one line, whatever the arguments hold
    print(emit.yaml_stream(manifests if isinstance(manifests, list) else [manifests], header=[made_by]), end="")
    return 0
