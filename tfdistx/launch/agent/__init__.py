"""cluster.launch=agent: an agent on every node (started by `srun`, a
JobSet's pods, or by hand) starts its node's worker in each round the
agents agree on at a rendezvous kept by one of them (node.py: the agent;
round_keeper.py: the rounds; messages.py and keeper_wire.py: what they say
and how; beats.py: an agent's beats; run_secret.py: what every beat
proves). No TensorFlow here, and no training code.
"""

from typing import List, Optional

from tfdistx.cluster.launch_spec import LaunchSpec, Rendezvous, Rounds, RoundsRecord
from tfdistx.cluster.placement import Placement
from tfdistx.launch.base import Launch, TaskStart, evaluator_line
from tfdistx.sigterm import SigtermNotice
from tfdistx.core import strategies, threads
from tfdistx.core.errors import ConfigError
from tfdistx.core.launch_mode import LaunchMode
from tfdistx.core.run_spec import Layout, RunSpec


class AgentLaunch(Launch):
    mode = LaunchMode.AGENT

    def refuse(self, layout: Layout, mode: str) -> None:
        if mode != "train":
            raise ConfigError.for_key(
                "cluster.launch",
                self.mode,
                f"agents train; `tfdistx evaluate` runs with cluster.launch={LaunchMode.LOCAL} "
                f"or {LaunchMode.TF_CONFIG}",
            )

    def start(self, spec: RunSpec, task: TaskStart, notice: Optional[SigtermNotice]) -> int:
        """This node's agent (node.py): its worker in each round the agents form (and, on the node that keeps the
        rounds, the run's servers: a parameter-server run's chief and ps, the tf.data service's); the agent that
        keeps the rounds records the run's config (`task.config_record`)."""
        layout, run_dir, cluster, agent = spec.layout, spec.run_dir, spec.cluster, spec.cluster.agent
        per_pool, _ = threads.task_threads(cluster.task_threads, layout.jobs_on_an_agents_node(keeper=False))
        keepers_pool, _ = threads.task_threads(cluster.task_threads, layout.jobs_on_an_agents_node(keeper=True))
        launch_spec = LaunchSpec.of(
            spec,
            task.command,
            task_env=threads.environment(per_pool),
            preload=task.preload if cluster.prefork else (),
            evaluator=cluster.evaluator,  # run by the agent that keeps the rounds
            rounds=Rounds(cluster.rounds, RoundsRecord.of(spec.run_dir, spec.checkpoint.dir)),
            agent=Rendezvous(
                store=agent.store,
                address=agent.address,
                token_file=agent.token_file,
                config=task.config,
                run_dir=str(run_dir),
                servers=dict(layout.servers_beside_the_keeper()),
                keeper_task_env=threads.environment(keepers_pool),
                config_record=task.config_record,  # written into .hydra/ by the agent that keeps the rounds
            ),
        )
        from tfdistx.launch.agent.node import run_agent  # deferred: node.py imports this package's modules

        return run_agent(launch_spec, notice)

    def plan(self, layout: Layout, placement: Placement) -> List[str]:
        topo = layout.cluster
        per_pool, why = threads.task_threads(topo.task_threads, layout.jobs_on_an_agents_node(keeper=False))
        lines = [
            "placement     an agent on every node (this process on this one): it starts the node's worker, "
            "placed by the",
            "              TF_CONFIG of each round the agents form at cluster.agent.store, and restarts it "
            "(cluster.max_restarts)",
            f"  threads     the node's worker: {threads.describe(per_pool)}; {why}",
        ]
        servers = layout.servers_beside_the_keeper()
        if servers:  # on the node whose agent keeps the rounds, in every round (node.py)
            keepers_pool, keepers_why = threads.task_threads(
                topo.task_threads, layout.jobs_on_an_agents_node(keeper=True)
            )
            lines.append(
                f"  servers     {strategies.describe_jobs(servers)}, on the store's node beside its worker: "
                "the run lives as long as that node"
            )
            lines.append(f"  threads     the store's node's tasks: {threads.describe(keepers_pool)}; {keepers_why}")
        if topo.evaluator:  # on the node whose agent keeps the rounds (node.py)
            lines.append(evaluator_line(", on the store's node beside its worker"))
        return lines


LAUNCH = AgentLaunch()
