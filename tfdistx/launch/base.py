"""The protocol of a launch: what every way a run's processes start
(tfdistx/launch/<mode>) may do. Each hook has a default, as Keras'
Callback's do: a launch overrides what it does, and nothing else needs to
know it is there (tfdistx/launch/__init__.py finds it by its mode).

No TensorFlow here, and no training code.
"""

from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

from tfdistx.cluster.placement import Placement
from tfdistx.sigterm import SigtermNotice
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout, RunSpec


@dataclass(frozen=True)
class Job:
    """A scheduler's script or manifests for a run: `tfdistx job KIND`."""

    kind: str  # the command's word
    what: str  # what it prints, for --help
    # The command that composes the config and writes it, "module:function" (a thin front-end in tfdistx/commands/,
    # the side that composes), called with the command line after `tfdistx job KIND`.
    command: str


@dataclass(frozen=True)
class TaskStart:
    """What starts one task of a run (commands/task.py), as the command side hands it to a launch that starts the
    processes itself."""

    mode: str  # train | evaluate
    command: Tuple[str, ...]  # the task's command line: it reads the run spec written for it, and TF_CONFIG
    preload: Tuple[str, ...]  # what every task imports first, done once (cluster/prefork.py), named by the engine
    config: str  # the digest of the resolved config every task reads (an agents' rendezvous admits that one only)
    config_record: Mapping[str, str] = field(default_factory=dict)  # the run's .hydra/ files (launch/agent/)


class Launch:
    """One way a run's processes start (`cluster.launch=MODE`), as LAUNCH in tfdistx/launch/MODE."""

    mode: LaunchMode
    # Under cluster.launch=auto the launches that have one are asked in its order, lowest first, whether they
    # placed this process (`detected`); None: never chosen so.
    detect_order: Optional[int] = None
    jobs: Tuple[Job, ...] = ()  # the scheduler's scripts or manifests whose tasks run under this launch
    # What a refusal of a scheduler's cluster calls it ("the Slurm step"), when it is not the config's.
    placed_where = "TF_CONFIG"

    def detected(self, env: Mapping[str, str]) -> bool:
        """Whether this process's environment says this launch placed it (under cluster.launch=auto)."""
        return False

    def place(self, layout: Layout, env: Mapping[str, str], training: bool) -> Placement:
        """Where this process stands. By default, a process that starts the run's tasks itself: their addresses
        are given each round, so the spec says only how many each job has. A scheduler's launch reads the place
        it gave from `env` (its cluster is then checked against the config's: launch.detect)."""
        counts = {**layout.training_jobs(), **(layout.service_jobs() if training else {})}
        return Placement(self.mode, cluster_spec={job: [""] * n for job, n in counts.items() if n})

    def refuse(self, layout: Layout, mode: str) -> None:
        """Raise ConfigError if this launch cannot start the run laid out as `layout` in `mode` (train |
        evaluate); asked before anything is written for its processes."""

    def start(self, spec: RunSpec, task: TaskStart, notice: Optional[SigtermNotice]) -> int:
        """Start the run's processes and keep them to the run's end (where tfdistx starts them: local, agent);
        the run's exit code. A scheduler's launch starts none: its tasks are placed by it."""
        raise ConfigError.for_key("cluster.launch", self.mode, "its scheduler starts the run's processes, not tfdistx")

    def plan(self, layout: Layout, placement: Placement) -> List[str]:
        """--plan's placement lines. By default a placed task's: where it stands, and the cluster it was given."""
        chief = " (chief)" if placement.is_chief else ""
        lines = [f"placement     {placement.launch}; this process is {placement.task_name}{chief}"]
        for job, addresses in placement.cluster_spec.items():
            for index, address in enumerate(addresses):
                lines.append(f"  task        {job}:{index}  {address}")
        lines.append(f"  TF_CONFIG   {placement.tf_config()}")
        return lines


def evaluator_line(where: str) -> str:
    """--plan's line of the sidecar evaluator a launch starts beside the cluster (`where`: on which node)."""
    return (
        f"  task        evaluator:0  the sidecar evaluator{where}: TF_CONFIG task {{'type': 'evaluator', 'index': 0}}, "
        "in no cluster spec; evaluates each checkpoint"
    )
