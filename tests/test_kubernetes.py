"""`tfdistx job tfjob|jobset|trainjob`: the manifests against their
controllers' own CRD schemas, and their pods run on this machine as the
controllers would run them (tests/simulated_pods.py: a network namespace,
an address and a host name per pod, port 2222; for a TFJob, TF_CONFIG in
the operator's format and restartPolicy ExitCode; for a JobSet, its labels
through the downward API and its failure and success policies)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import free_ports, steps_logged, tfdistx_env, workers_tf_config
from tfdistx.core.errors import PERMANENT

K8S = Path(__file__).with_name("data") / "k8s"  # the controllers' own CRDs, unchanged (its README.md)
CRD = K8S / "kubeflow.org_tfjobs.yaml"
SIMULATOR = Path(__file__).with_name("simulated_pods.py")


def export(*args, cwd=None, kind="tfjob"):
    return subprocess.run(
        [sys.executable, "-m", "tfdistx", "job", kind, *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def crd_schema(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=yaml.CSafeLoader)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def tfjob_schema():
    return crd_schema(CRD)


def unknown_fields(value, schema, path="") -> list:
    """Fields the API server would silently drop (a structural schema prunes
    what it does not list): a typo there is never an error, so look for it."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = [f"{path}.{key}" for key in value if key not in schema["properties"]]
        return found + [
            f
            for key, item in value.items()
            if key in schema["properties"]
            for f in unknown_fields(item, schema["properties"][key], f"{path}.{key}")
        ]
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [
            f
            for key, item in value.items()
            for f in unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
        ]
    if isinstance(value, list) and "items" in schema:
        return [f for i, item in enumerate(value) for f in unknown_fields(item, schema["items"], f"{path}[{i}]")]
    return []


@pytest.mark.parametrize(
    "args, replicas, gpus",
    [
        (["strategy=multiworker", "cluster=2x1"], {"Worker": 2}, None),
        (["strategy=multiworker", "cluster=4x8", "--gpus"], {"Worker": 4}, 8),
        (
            ["strategy=parameter_server", "cluster=ps2w4", "trainer.steps=4000"],
            {"Chief": 1, "PS": 2, "Worker": 4},
            None,
        ),
        (["strategy=mirrored", "cluster=1x4", "--gpus"], {"Worker": 1}, 4),
    ],
)
def test_exported_tfjob_is_valid_for_the_operator_and_composes_the_same_config(tfjob_schema, args, replicas, gpus):
    from tfdistx.config import schema as config_schema
    from tfdistx.config.compose import compose_and_validate
    from tfdistx.config.topology import register

    out = export(
        *args, "--image", "registry.example/tfdistx:0.1", "--volume", "pvc:runs", "--name", "mnist", "--namespace", "ml"
    )
    assert out.returncode == 0, out.stderr
    manifest = yaml.safe_load(out.stdout)
    jsonschema.Draft7Validator(tfjob_schema).validate(manifest)
    assert unknown_fields(manifest, tfjob_schema) == []

    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert manifest["metadata"]["name"] == "mnist" and manifest["metadata"]["namespace"] == "ml"
    assert manifest["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running"}  # cluster.max_restarts
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {rtype: spec["replicas"] for rtype, spec in specs.items()} == replicas
    for rtype, spec in specs.items():
        assert spec["restartPolicy"] == "ExitCode"
        pod = spec["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "tensorflow" and container["ports"] == [
            {"name": "tfjob-port", "containerPort": 2222}
        ]
        assert container["command"] == ["python", "-m", "tfdistx"]
        assert container["volumeMounts"] == [{"name": "tfdistx-runs", "mountPath": "/mnt/tfdistx"}]
        assert pod["volumes"] == [{"name": "tfdistx-runs", "persistentVolumeClaim": {"claimName": "runs"}}]
        wants_gpus = gpus if rtype == "Worker" else None  # a coordinator and ps tasks compute nothing
        assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == wants_gpus
        pod_args = container["args"]
        assert pod_args[-1] == "hydra.run.dir=/mnt/tfdistx/mnist" and "cluster.retryable_exit_offset=128" in pod_args

    # What a pod composes is what the export composed (placement and exit codes aside).
    overrides = [a for a in args if a != "--gpus"]
    config_schema.register()
    register(overrides)
    here = compose_and_validate(overrides, notes=False)
    in_pod = compose_and_validate([a for a in pod_args if not a.startswith("hydra.run.dir=")], notes=False)
    for group in ("strategy", "model", "data", "optimizer", "task", "trainer", "checkpoint"):
        assert in_pod[group] == here[group], group
    assert in_pod.cluster.retryable_exit_offset == 128 and here.cluster.retryable_exit_offset == 0
    assert (in_pod.cluster.workers, in_pod.cluster.ps) == (here.cluster.workers, here.cluster.ps)


@pytest.fixture(scope="module")
def jobset_schemas():
    return {
        kind: crd_schema(K8S / f"{group}_{kind.lower()}s.yaml")
        for group, kind in [
            ("jobset.x-k8s.io", "JobSet"),
            ("trainer.kubeflow.org", "TrainJob"),
            ("trainer.kubeflow.org", "ClusterTrainingRuntime"),
            ("trainer.kubeflow.org", "TrainingRuntime"),
        ]
    }


def valid(manifest: dict, schema: dict) -> None:
    jsonschema.Draft7Validator(schema).validate(manifest)
    assert unknown_fields(manifest, schema) == []


def valid_network_policy(policy: dict, name: str, namespace: str) -> None:
    """Valid for the Kubernetes API (its own generated models, which refuse an
    unknown field or a wrong type), and admitting the JobSet's own pods only."""
    from kubernetes.client.models import V1NetworkPolicy

    assert V1NetworkPolicy.model_validate(policy).model_dump(by_alias=True, exclude_none=True) == policy
    own = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": name}}
    assert (policy["metadata"]["namespace"], policy["spec"]) == (
        namespace,
        {"podSelector": own, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": own}]}]},
    )


@pytest.mark.parametrize(
    "args, tasks, gpus",
    [
        (["strategy=multiworker", "cluster=2x1"], {"worker": 2}, None),
        (["strategy=multiworker", "cluster=4x8", "--gpus"], {"worker": 4}, 8),
        (
            [
                "strategy=parameter_server",
                "cluster=ps2w4",
                "trainer.steps=4000",
                "cluster.evaluator=true",
                "data.service.workers=1",
            ],
            {"chief": 1, "ps": 2, "worker": 4, "evaluator": 1, "dispatcher": 1, "dataworker": 1},
            None,
        ),
    ],
)
def test_exported_jobset_and_trainjob_are_valid_for_their_controllers(jobset_schemas, args, tasks, gpus):
    common = [
        *args,
        "--image",
        "registry.example/tfdistx:0.1",
        "--volume",
        "pvc:runs",
        "--name",
        "mnist",
        "--namespace",
        "ml",
    ]
    out = export(*common, kind="jobset")
    assert out.returncode == 0, out.stderr
    jobset, policy = yaml.safe_load_all(out.stdout)
    valid(jobset, jobset_schemas["JobSet"])
    valid_network_policy(policy, "mnist", "ml")
    assert (jobset["apiVersion"], jobset["kind"], jobset["metadata"]["name"]) == (
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "mnist",
    )
    spec = jobset["spec"]
    assert spec["network"] == {"enableDNSHostnames": True}
    assert spec["successPolicy"] == {
        "operator": "All",
        "targetReplicatedJobs": ["chief" if "chief" in tasks else "worker"],
    }
    assert (spec["failurePolicy"]["maxRestarts"], spec["failurePolicy"]["restartStrategy"]) == (
        3,
        "BlockingRecreate",
    )  # cluster.max_restarts
    assert [(rule["action"], rule["onJobFailureReasons"]) for rule in spec["failurePolicy"]["rules"]] == [
        ("RestartJobSetAndIgnoreMaxRestarts", ["PodFailurePolicy"]),
        ("FailJobSet", ["PodFailurePolicy"]),
        ("RestartJobSet", ["BackoffLimitExceeded"]),
    ]
    # the JobSet webhook admits a rule's name only in this form (its ruleNameFmt)
    assert all(
        re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]) for rule in spec["failurePolicy"]["rules"]
    )
    # a preemption (42, matched by the message of the Job's second FailJob rule) does not count toward maxRestarts
    assert spec["failurePolicy"]["rules"][0]["onJobFailureMessagePatterns"] == [
        "with exit code 42 matching FailJob rule at index 1$"
    ]
    # one Indexed Job per task type, a pod per task: the pods' names are <name>-<type>-0-<index>.<name>
    assert {
        job["name"]: (job["replicas"], job["template"]["spec"]["parallelism"]) for job in spec["replicatedJobs"]
    } == {job: (1, n) for job, n in tasks.items()}
    for job in spec["replicatedJobs"]:
        job_spec = job["template"]["spec"]
        if job["name"] == "evaluator":  # restarted in place, alone: never the set's failure (cluster/evaluator.py)
            assert (
                job_spec["backoffLimit"] == 2**31 - 1 and job_spec["template"]["spec"]["restartPolicy"] == "OnFailure"
            )
            assert "podFailurePolicy" not in job_spec
            assert all(
                rule["targetReplicatedJobs"] == [name for name in tasks if name != "evaluator"]
                for rule in spec["failurePolicy"]["rules"]
            )
            continue
        assert job_spec["completionMode"] == "Indexed" and job_spec["backoffLimit"] == 0
        # a bad config (2), a full disk (3) fail the job set; 42
        # restarts it uncounted; 4, 5 (and a killed pod) restart it
        rule, preempted = job_spec["podFailurePolicy"]["rules"]
        assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "In"
        assert {2, 3} <= set(rule["onExitCodes"]["values"]) and not {4, 5, 42} & set(rule["onExitCodes"]["values"])
        assert preempted["action"] == "FailJob" and preempted["onExitCodes"]["values"] == [42]
        pod = job_spec["template"]["spec"]
        (container,) = pod["containers"]
        assert pod["restartPolicy"] == "Never" and pod["volumes"] == [
            {"name": "tfdistx-runs", "persistentVolumeClaim": {"claimName": "runs"}}
        ]
        assert container["args"][-2:] == ["cluster.launch=jobset", "hydra.run.dir=/mnt/tfdistx/mnist"]
        assert container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu") == (
            gpus if job["name"] == "worker" else None
        )

    out = export(*common, kind="trainjob")
    assert out.returncode == 0, out.stderr
    runtime, trainjob = yaml.safe_load_all(out.stdout)
    valid(runtime, jobset_schemas["ClusterTrainingRuntime"])
    valid(
        {**runtime, "kind": "TrainingRuntime", "metadata": {**runtime["metadata"], "namespace": "ml"}},
        jobset_schemas["TrainingRuntime"],
    )
    valid(trainjob, jobset_schemas["TrainJob"])
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    # the runtime's JobSet is the JobSet's, with the trainer step labelled for Trainer v2 and its container named `node`
    steps = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [job["name"] for job in steps] == list(tasks)
    assert [job["template"].get("metadata") for job in steps] == [
        {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}} if job == "worker" else None
        for job in tasks
    ]
    assert trainjob["spec"]["trainer"]["numNodes"] == tasks["worker"]


# The export's other checks (the strategy, --name, --volume, the composed
# config) are tested in-process in test_unit_config_recipes.py; --mount-path
# is checked in the command's own argument handling.
@pytest.mark.parametrize(
    "args, says",
    [
        (["--mount-path", "runs"], "--mount-path='runs': must be an absolute path"),
    ],
)
def test_bad_export_input_is_one_line_and_exit_2(args, says):
    out = export("--image", "img", *args)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in out.stderr, out.stderr


def test_export_without_a_volume_warns_that_checkpoints_die_with_the_pod():
    out = export("cluster=2x1", "--image", "img")
    assert out.returncode == 0
    assert "no --volume" in out.stderr
    pod_args = yaml.safe_load(out.stdout)["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert not any(a.startswith("hydra.run.dir=") for a in pod_args)


def test_retryable_exit_codes_move_up_by_the_offset(tfdistx, tmp_path):
    """A cluster that does not form exits 4, or 132 for Kubernetes' ExitCode
    policy (which retries only 128-255); a bad config stays 2 either way."""
    lonely = {"TF_CONFIG": workers_tf_config(free_ports(2), 1)}
    codes = {}
    for offset in (0, 128):
        run = tfdistx(
            "strategy=multiworker",
            "cluster=2x1",
            "data=synthetic",
            "cluster.startup_timeout=2",
            f"cluster.retryable_exit_offset={offset}",
            run_dir=tmp_path / str(offset),
            env=lonely,
        )
        assert "the cluster did not form within cluster.startup_timeout=2s" in run.stderr, run
        codes[offset] = run.returncode
    assert codes == {0: 4, 128: 132}
    assert tfdistx("trainer.steps=0", "cluster.retryable_exit_offset=128").returncode == 2


# --- the pods, simulated -----------------------------------------------------


def _can_simulate() -> str:
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2's ip and util-linux's unshare"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", "--mount", "ip", "link", "add", "br0", "type", "bridge"],
        capture_output=True,
        text=True,
    )
    return (
        ""
        if probe.returncode == 0
        else f"this machine allows no user and network namespaces with a bridge: {probe.stderr.strip()}"
    )


@pytest.fixture(scope="module")
def simulator():
    why = _can_simulate()
    if why:
        pytest.skip(why)


def run_tfjob(tmp_path, name, overrides, **kill):
    return run_pods(tmp_path, name, overrides, kind="tfjob", **kill)


def run_pods(
    tmp_path,
    name,
    overrides,
    kill=None,
    when="checkpoints/ckpt-400.index",
    signal="KILL",
    kind="tfjob",
    edit=None,
    succeeds=True,
):
    """Export the TFJob or JobSet (`kind`; hostPath volume under tmp_path; `edit`: a change to
    it, as a user's by hand), run its pods, and send `signal` to pod `kill` (if any) once the
    run dir's file `when` has content."""
    volume = tmp_path / "volume"
    out = export(*overrides, "--image", "tfdistx:test", "--name", name, "--volume", f"hostPath:{volume}", kind=kind)
    assert out.returncode == 0, out.stderr
    manifest = tmp_path / f"{kind}.json"
    documents = list(yaml.safe_load_all(out.stdout))
    exported = (
        as_trainer_v2_runs_it(*documents) if kind == "trainjob" else documents[0]
    )  # a JobSet's NetworkPolicy: not simulated
    if edit:
        edit(exported)
    manifest.write_text(json.dumps(exported))
    secrets = tmp_path / "secrets.json"  # what the pods' secret volumes mount (an agents' JobSet's rendezvous)
    secrets.write_text(json.dumps([d for d in documents if d.get("kind") == "Secret"]))
    pods = tmp_path / "pods"
    killing = ["--kill", kill, "--signal", signal, "--when-exists", f"/mnt/tfdistx/{name}/{when}"] if kill else []
    run = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--net",
            "--mount",
            "--fork",
            "--kill-child",
            sys.executable,
            str(SIMULATOR),
            str(manifest),
            str(pods),
            "--secrets",
            str(secrets),
            "--timeout",
            "300",
            *killing,
        ],
        capture_output=True,
        text=True,
        timeout=420,
    )
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    logs = {p.stem: p.read_text(errors="replace") for p in (pods / "logs").glob("*.log")}
    assert run.returncode == (0 if succeeds else 1), (
        run.stderr[-2000:],
        events,
        {k: v[-3000:] for k, v in logs.items()},
    )
    return volume, events, logs


def exits(events, pod):
    return [e["code"] for e in events if e["event"] == "exited" and e["pod"] == pod]


def test_the_export_names_the_code_of_the_users_that_the_image_must_hold():
    """A `_target_` in the user's own package is imported in every pod: the
    export says which module, and which key names it; tfdistx's own and
    Keras' targets need nothing said."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfdistx",
            "job",
            "jobset",
            "strategy=multiworker",
            "cluster=2x1",
            "model._target_=user_plugins.sequential_without_input",
            "+callbacks.s._target_=keras.callbacks.CSVLogger",
            "+callbacks.s.filename=x.csv",
            "--image",
            "img",
            "--volume",
            "pvc:runs",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=tfdistx_env(),
    )
    assert run.returncode == 0, run.stderr
    warned = [line for line in run.stderr.splitlines() if "which tfdistx does not install" in line]
    assert warned == [
        "tfdistx: WARNING: the pods import user_plugins (model._target_=user_plugins.sequential_without_input), "
        "which tfdistx does not install: the image must have each (installed, or on the pods' PYTHONPATH)"
    ], run.stderr


def test_the_pods_compose_with_the_config_dir_the_export_was_given(tmp_path, simulator):
    """`--config-dir` goes into each pod's command, so `experiment=mine` composes there too."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(
        "# @package _global_\n# a short run\ntrainer:\n  steps: 20\n  steps_per_loop: 10\n"
        "  log_every: 10\n  eval_every: 0\ncheckpoint:\n  export: false\n"
    )
    volume, events, logs = run_tfjob(
        tmp_path, "own", ["--config-dir", str(tmp_path / "conf"), "experiment=mine", "strategy=one_device"]
    )
    assert exits(events, "own-worker-0") == [0]
    assert json.loads((volume / "own" / "summary.json").read_text())["step"] == 20


# 57 s: a killed worker's restart and resume is in the default run as test_fault_tolerance's random kill
@pytest.mark.slow
def test_multiworker_tfjob_pods_train_and_a_killed_worker_pod_resumes_the_run(tmp_path, simulator):
    volume, events, logs = run_tfjob(
        tmp_path,
        "mw",
        ["strategy=multiworker", "cluster=2x1", "data=synthetic", "trainer.steps=1500", "checkpoint.every_steps=200"],
        kill="mw-worker-1",
    )
    # worker 1 was killed (137) and recreated at a new address; worker 0 lost its
    # peer and left with 5 + 128, which the ExitCode policy retries; both finished.
    assert exits(events, "mw-worker-1") == [137, 0]
    assert exits(events, "mw-worker-0") == [133, 0]
    assert "lost contact with worker:1 of the cluster" in logs["mw-worker-0"]
    assert len({e["address"] for e in events if e["event"] == "started"}) == 4
    assert events[-1] == {**events[-1], "event": "job", "status": "Succeeded"}
    # one run dir on the shared volume, resumed from a checkpoint, with every step logged once
    assert [p.name for p in volume.iterdir()] == ["mw"]
    summary = json.loads((volume / "mw" / "summary.json").read_text())
    assert summary["step"] == 1500 and summary["workers"] == 2 and summary["resumed"]
    assert summary["resumed_from_step"] >= 400 and summary["resumed_from_step"] % 200 == 0
    assert steps_logged(volume / "mw") == list(range(100, 1501, 100))
    assert "listens on port 2222" in logs["mw-worker-1"]


@pytest.mark.slow  # the default run kills a worker pod and a ps pod; eviction (SIGTERM) is the same restart path
def test_an_evicted_worker_pod_checkpoints_the_tfjob_and_it_resumes_from_that_step(tmp_path, simulator):
    """Eviction is SIGTERM to one pod: every worker saves at one step and
    leaves with 42 + 128, which the ExitCode policy retries; no step is lost.
    (The signal comes once step 100 is logged, so every pod is training.)"""
    volume, events, logs = run_tfjob(
        tmp_path,
        "ev",
        ["strategy=multiworker", "cluster=2x1", "data=synthetic", "trainer.steps=1500", "checkpoint.every_steps=1000"],
        kill="ev-worker-1",
        when="metrics.jsonl",
        signal="TERM",
    )
    assert exits(events, "ev-worker-1") == [170, 0] and exits(events, "ev-worker-0") == [170, 0]
    preempted_at = int(re.search(r"preempted at step (\d+)", logs["ev-worker-0"]).group(1))
    assert 0 < preempted_at < 1500
    summary = json.loads((volume / "ev" / "summary.json").read_text())
    assert summary["step"] == 1500 and summary["resumed_from_step"] == preempted_at


@pytest.mark.slow  # a lost ps restarting the cluster from its checkpoint runs by default in test_fault_tolerance
def test_parameter_server_tfjob_pods_train_and_a_killed_ps_pod_resumes_the_run(tmp_path, simulator):
    """A lost ps task takes its variables with it: the coordinator stops with
    one line and 5 + 128, is recreated, and resumes from the checkpoint."""
    volume, events, logs = run_tfjob(
        tmp_path,
        "ps",
        [
            "strategy=parameter_server",
            "cluster=ps1w2",
            "data=synthetic",
            "trainer.steps=1500",
            "checkpoint.every_steps=200",
        ],
        kill="ps-ps-0",
    )
    assert exits(events, "ps-ps-0") == [137]  # recreated, and deleted at the end (cleanPodPolicy Running)
    assert exits(events, "ps-chief-0") == [133, 0]
    assert "lost contact with ps:0 of the cluster" in logs["ps-chief-0"]
    assert [p.name for p in volume.iterdir()] == ["ps"]
    summary = json.loads((volume / "ps" / "summary.json").read_text())
    assert summary["step"] == 1500 and summary["ps"] == 1 and summary["resumed"]
    assert summary["resumed_from_step"] >= 400 and summary["resumed_from_step"] % 200 == 0


@pytest.mark.slow
def test_parameter_server_tfjob_carries_on_while_a_killed_worker_pod_is_recreated(tmp_path, simulator):
    """The coordinator schedules around a lost worker: no restart of the run."""
    volume, events, logs = run_tfjob(
        tmp_path,
        "psw",
        [
            "strategy=parameter_server",
            "cluster=ps1w2",
            "data=synthetic",
            "trainer.steps=1500",
            "checkpoint.every_steps=200",
        ],
        kill="psw-worker-0",
    )
    assert exits(events, "psw-worker-0") == [137]
    assert exits(events, "psw-chief-0") == [0]
    summary = json.loads((volume / "psw" / "summary.json").read_text())
    assert summary["step"] == 1500 and not summary["resumed"]


# --- a JobSet's pods, simulated ------------------------------------------------

DETERMINISTIC = [
    "data=synthetic",
    "trainer.deterministic=true",
    "trainer.steps_per_loop=50",
    "trainer.log_every=100",
    "trainer.eval_every=0",
    "checkpoint.every_steps=100",
    "checkpoint.export=false",
    "logger.tensorboard=false",
    "cluster.preemption_grace=15",
]


def local_weights(tmp_path, overrides) -> str:
    """The weights the same config trains to on a local cluster (the launcher's tasks on loopback)."""
    run = subprocess.run(
        [sys.executable, "-m", "tfdistx", *overrides, f"hydra.run.dir={tmp_path / 'local'}"],
        env=tfdistx_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "local" / "summary.json").read_text())["weights_sha256"]


def test_multiworker_jobset_pods_place_themselves_and_train_as_a_local_cluster(tmp_path, simulator):
    """No TF_CONFIG: each pod builds it from its JobSet labels (cluster.launch=jobset); the
    chief's weights are bitwise those of the same config on a local cluster."""
    overrides = ["strategy=multiworker", "cluster=2x1", *DETERMINISTIC, "trainer.steps=200"]
    volume, events, logs = run_pods(tmp_path, "mw", overrides, kind="jobset")
    assert exits(events, "mw-worker-0-0") == [0] and exits(events, "mw-worker-0-1") == [0]
    assert events[-1] == {**events[-1], "event": "job", "status": "Succeeded", "restarts": 0}
    assert "task worker:1 listens on port 2222" in logs["mw-worker-0-1"]
    summary = json.loads((volume / "mw" / "summary.json").read_text())
    assert summary["step"] == 200 and summary["workers"] == 2
    assert summary["weights_sha256"] == local_weights(tmp_path, overrides)


AGENTS = [
    "strategy=multiworker",
    "cluster=2x1",
    "cluster.launch=agent",
    *DETERMINISTIC,
    "trainer.steps=200",
    "cluster.elastic.join_grace=1",
]


def test_an_agent_jobset_is_one_indexed_job_of_agents_meeting_at_pod_0_and_valid(jobset_schemas):
    """cluster.launch=agent: one Indexed Job of an agent per pod; pod 0's keeps the rounds at its DNS name.
    A lost pod is the agents' (recreated, not counted, while no code says no restart can cure it): the set
    fails only on those codes, and is done when pod 0 is."""
    out = export(*AGENTS, "--image", "img", "--name", "ag", "--volume", "pvc:runs", kind="jobset")
    assert out.returncode == 0, out.stderr
    jobset, policy, secret = yaml.safe_load_all(out.stdout)
    valid(jobset, jobset_schemas["JobSet"])
    valid_network_policy(policy, "ag", "default")
    valid_secret(secret, "ag-rendezvous", "default")
    [job] = jobset["spec"]["replicatedJobs"]
    spec = job["template"]["spec"]
    assert (job["name"], spec["completions"], spec["parallelism"], spec["successPolicy"]) == (
        "worker",
        2,
        2,
        {"rules": [{"succeededIndexes": "0"}]},
    )
    rules = spec["podFailurePolicy"]["rules"]
    assert [(r["action"], r.get("onExitCodes", {}).get("values")) for r in rules] == [
        ("FailJob", list(PERMANENT)),
        ("Ignore", [42]),
        ("Ignore", None),
    ]
    pod = spec["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args.count("cluster.launch=agent") == 1 and args[-2:] == [
        "cluster.agent.store=ag-worker-0-0.ag:2222",
        "cluster.agent.token_file=/var/run/secrets/tfdistx/token",
    ]
    # every pod mounts the Secret the export wrote, read-only, where its agent reads the run's secret
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/var/run/secrets/tfdistx"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] and volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert list(secret["stringData"]) == ["token"]  # the file the args name
    again = yaml.safe_load_all(export(*AGENTS, "--image", "img", "--name", "ag", kind="jobset").stdout)
    assert list(again)[2]["stringData"] != secret["stringData"]  # a new secret at each export


def valid_secret(secret: dict, name: str, namespace: str) -> None:
    """Valid for the Kubernetes API (its generated model), an Opaque Secret of 256 random bits in hex."""
    from kubernetes.client.models import V1Secret

    assert V1Secret.model_validate(secret).model_dump(by_alias=True, exclude_none=True) == secret
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"], secret["type"]) == (name, namespace, "Opaque")
    assert re.fullmatch(r"[0-9a-f]{64}", secret["stringData"]["token"])


@pytest.mark.slow  # the agents themselves are the default run's (test_agents.py): this is their JobSet
def test_an_agent_jobsets_pods_simulated_train_as_a_local_cluster(tmp_path, simulator):
    """The agents find pod 0 by its DNS name and train to a local 2x1 run's weights, bit for bit."""
    local = [o for o in AGENTS if o != "cluster.launch=agent"]
    volume, events, logs = run_pods(tmp_path, "ag", AGENTS, kind="jobset")
    assert exits(events, "ag-worker-0-0") == [0] and exits(events, "ag-worker-0-1") == [0], logs
    assert "keeping the rounds at ag-worker-0-0.ag:2222" in logs["ag-worker-0-0"]
    summary = json.loads((volume / "ag" / "summary.json").read_text())
    assert summary["step"] == 200 and summary["workers"] == 2
    assert summary["weights_sha256"] == local_weights(tmp_path, local)


@pytest.mark.slow
def test_a_killed_jobset_pod_restarts_the_set_and_the_run_resumes_bitwise(tmp_path, simulator):
    """The killed pod (137) matches no FailJob rule: its Job fails (backoffLimit 0), the JobSet's
    failurePolicy restarts every pod, and the run resumes from its checkpoint to the weights of a
    run never stopped."""
    overrides = ["strategy=multiworker", "cluster=2x1", *DETERMINISTIC, "trainer.steps=1000"]
    volume, events, logs = run_pods(tmp_path, "mw", overrides, kind="jobset", kill="mw-worker-0-1")
    assert exits(events, "mw-worker-0-1")[0] == 137 and exits(events, "mw-worker-0-1")[-1] == 0
    assert [e["attempt"] for e in events if e["event"] == "restarted"] == [1]
    summary = json.loads((volume / "mw" / "summary.json").read_text())
    assert summary["step"] == 1000 and summary["resumed"] and summary["resumed_from_step"] >= 400
    assert steps_logged(volume / "mw") == list(range(100, 1001, 100))
    assert summary["weights_sha256"] == local_weights(tmp_path, overrides)


def test_an_evicted_jobset_pod_restarts_the_set_without_spending_a_restart(tmp_path, simulator):
    """Eviction is SIGTERM to one pod: every worker saves at one step and
    exits 42, which its Job's second FailJob rule matches; the JobSet's
    `preempted` rule restarts the set without counting it, so even with
    cluster.max_restarts=0 the run resumes from that step and finishes."""
    overrides = [
        "strategy=multiworker",
        "cluster=2x1",
        "data=synthetic",
        "trainer.steps=600",
        "trainer.steps_per_loop=50",
        "trainer.log_every=50",
        "checkpoint.every_steps=1000",
        "cluster.max_restarts=0",
    ]
    volume, events, logs = run_pods(
        tmp_path, "ev", overrides, kind="jobset", kill="ev-worker-0-1", when="metrics.jsonl", signal="TERM"
    )
    # each worker's first end is 42 (the first seen fails its Job; the other is deleted with the set), its last 0
    for pod in ("ev-worker-0-0", "ev-worker-0-1"):
        ended = [e["code"] for e in events if e["event"] in ("exited", "deleted") and e["pod"] == pod]
        assert ended[0] == 42 and ended[-1] == 0, (pod, ended)
    failed = [e for e in events if e["event"] == "job failed"]
    assert failed and {(e["reason"], e["rule"]) for e in failed} == {("PodFailurePolicy", "preempted")}
    assert [e["attempt"] for e in events if e["event"] == "restarted"] == [1]
    preempted_at = int(re.search(r"preempted at step (\d+)", logs["ev-worker-0-0"]).group(1))
    summary = json.loads((volume / "ev" / "summary.json").read_text())
    assert summary["step"] == 600 and summary["resumed_from_step"] == preempted_at


@pytest.mark.slow
def test_parameter_server_jobset_pods_train_and_a_killed_ps_pod_restarts_the_set(tmp_path, simulator):
    """A lost ps takes its variables with it: the JobSet restarts, the coordinator resumes."""
    overrides = ["strategy=parameter_server", "cluster=ps1w2", *DETERMINISTIC, "trainer.steps=1000"]
    volume, events, logs = run_pods(tmp_path, "ps", overrides, kind="jobset", kill="ps-ps-0-0")
    # the ps's 137 and the coordinator's 5 may be seen in either order:
    # the first seen restarts the set, the other is deleted with it
    ended = {
        pod: [e["code"] for e in events if e["event"] in ("exited", "deleted") and e["pod"] == pod]
        for pod in ("ps-ps-0-0", "ps-chief-0-0")
    }
    assert ended["ps-ps-0-0"][0] == 137 and ended["ps-chief-0-0"][0] == 5 and exits(events, "ps-chief-0-0")[-1] == 0
    assert "lost contact with ps:0 of the cluster" in logs["ps-chief-0-0"]
    assert [e["attempt"] for e in events if e["event"] == "restarted"] == [1]
    summary = json.loads((volume / "ps" / "summary.json").read_text())
    assert summary["step"] == 1000 and summary["ps"] == 1 and summary["resumed"] and summary["resumed_from_step"] >= 400


def as_trainer_v2_runs_it(runtime: dict, trainjob: dict) -> dict:
    """The JobSet Kubeflow Trainer v2 makes of a TrainJob and its runtime (its JobSet plugin's
    builder): named after the TrainJob, the runtime's template, and in the replicatedJob
    labelled as the trainer step one Job of numNodes pods whose `node` container takes the
    TrainJob's image, command, args and resources."""
    spec = json.loads(json.dumps(runtime["spec"]["template"]["spec"]))
    trainer = trainjob["spec"].get("trainer", {})
    for job in spec["replicatedJobs"]:
        if (
            job["template"].get("metadata", {}).get("labels", {}).get("trainer.kubeflow.org/trainjob-ancestor-step")
            != "trainer"
        ):
            continue
        nodes = trainer.get("numNodes", runtime["spec"].get("mlPolicy", {}).get("numNodes", 1))
        job["replicas"], job["template"]["spec"]["parallelism"], job["template"]["spec"]["completions"] = (
            1,
            nodes,
            nodes,
        )
        for container in job["template"]["spec"]["template"]["spec"]["containers"]:
            if container["name"] == "node":
                container.update({key: trainer[key] for key in ("image", "command", "args") if key in trainer})
                if "resourcesPerNode" in trainer:
                    container["resources"] = trainer["resourcesPerNode"]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": trainjob["metadata"]["name"]},
        "spec": spec,
    }


@pytest.mark.slow  # the default run has the JobSet's 2x1; a TrainJob's pods are its runtime's JobSet's
def test_trainjob_pods_train_as_a_local_cluster(tmp_path, simulator):
    overrides = ["strategy=multiworker", "cluster=2x1", *DETERMINISTIC, "trainer.steps=200"]
    volume, events, logs = run_pods(tmp_path, "tj", overrides, kind="trainjob")
    assert exits(events, "tj-worker-0-0") == [0] and exits(events, "tj-worker-0-1") == [0]
    summary = json.loads((volume / "tj" / "summary.json").read_text())
    assert summary["step"] == 200 and summary["weights_sha256"] == local_weights(tmp_path, overrides)


def test_a_pod_the_config_has_no_place_for_fails_the_jobset_without_a_restart(tmp_path, simulator):
    """A JobSet edited to 3 workers for a config of 2: the third pod is refused in one line and
    exits 2, which matches its Job's FailJob rule, and the JobSet's failurePolicy fails the set."""

    def three_workers(jobset):
        job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
        job["parallelism"] = job["completions"] = 3

    overrides = ["strategy=multiworker", "cluster=2x1", "data=synthetic", "cluster.preemption_grace=1"]
    volume, events, logs = run_pods(tmp_path, "bad", overrides, kind="jobset", edit=three_workers, succeeds=False)
    assert exits(events, "bad-worker-0-2") == [2]
    assert logs["bad-worker-0-2"].strip().splitlines()[-1] == (
        "tfdistx: invalid config: batch.kubernetes.io/job-completion-index='2': the config's cluster has 2 worker "
        "task(s): allowed 0..1"
    )
    (failed,) = [e for e in events if e["event"] == "job failed"]
    assert (failed["reason"], failed["action"]) == ("PodFailurePolicy", "FailJobSet")
    assert not [e for e in events if e["event"] == "restarted"] and events[-1]["status"].startswith("Failed")
