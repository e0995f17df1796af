"""Kubernetes dry run: launch/k8s/render.py's PyTorchJob against the Hydra-composed topology config,
the torchrun command its pods would run (launch/run_multinode.sh under DRY_RUN=1), and its refusals."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dlrm.config.compose import compose
from tests.helpers import REPO_ROOT as ROOT

RENDER = ROOT / "launch" / "k8s" / "render.py"
_spec = importlib.util.spec_from_file_location("k8s_render", RENDER)
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def job_for(*argv: str) -> dict:
    """The rendered manifest, parsed (the module's main, output to stdout)."""
    args = render.parse_args(list(argv))
    return yaml.safe_load(render.render(args, list(argv)))


def container(job: dict, replica: str) -> dict:
    (c,) = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"]
    return c


def pod_env() -> dict:
    """This environment as a pod's image has it: a python3 with torch first on PATH (find_torchrun then starts
    `python3 -m dlrm.torchrun`, as in the image, unless DLRM_VENV names a venv: `<venv>/bin/python -m ...`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_", "GLOO_", "TORCH_NCCL"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def pod_torchrun(job: dict, replica: str, rank: int) -> list[str]:
    """Run the pod's command here under DRY_RUN=1, with the env the operator and the manifest give it."""
    c = container(job, replica)
    env = pod_env()
    for k in ("NNODES", "NODE_RANK", "RUN_DIR", "RDZV_ENDPOINT", "MASTER_ADDR", "MASTER_PORT", "NGPU"):
        env.pop(k, None)
    env.update({e["name"]: e["value"] for e in c["env"]})
    name = job["metadata"]["name"]
    env.update(DRY_RUN="1", RANK=str(rank), MASTER_ADDR=f"{name}-master-0", MASTER_PORT="29500")
    r = subprocess.run(c["command"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [line[2:] for line in r.stderr.splitlines() if line.startswith("+ ")]
    assert len(lines) == 1, r.stderr
    return shlex.split(lines[0])


def option(cmd: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in cmd if a.startswith(name + "=")]
    return value


@pytest.mark.parametrize("nodes", [2, 4])
def test_manifest_matches_the_topology_config(nodes):
    overrides = ["topology=dgx_h100_multinode", f"topology.nodes={nodes}", "experiment=dcn_small"]
    topo = compose(overrides).topology
    job = job_for("--image", "registry.example/dlrm:1", "--name", "dcn", "--pvc", "dcn-outputs", *overrides)
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    # one pod per node: the Master plus nodes-1 Workers
    assert specs["Master"]["replicas"] == 1
    assert specs["Master"]["replicas"] + specs["Worker"]["replicas"] == topo.nodes == nodes
    elastic = job["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and elastic["maxRestarts"] == 3
    assert elastic["minReplicas"] == elastic["maxReplicas"] == topo.nodes
    assert elastic["rdzvHost"] == "dcn-master-0" and elastic["rdzvPort"] == 29500
    assert job["spec"]["nprocPerNode"] == str(topo.ranks_per_node)
    for replica in ("Master", "Worker"):
        c = container(job, replica)
        assert c["name"] == "pytorch" and c["image"] == "registry.example/dlrm:1"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == topo.ranks_per_node == 8
        assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == 1
        assert c["resources"]["requests"] == c["resources"]["limits"]
        assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]
        assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        pod = specs[replica]["template"]["spec"]
        assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
        assert "hostNetwork" not in pod
    # the torchrun command each pod runs: the topology's nodes and ranks per node, c10d on the Master
    for replica, rank in (("Master", 0), ("Worker", nodes - 1)):
        cmd = pod_torchrun(job, replica, rank)
        assert cmd[1:3] == ["-m", "dlrm.torchrun"]  # its own store for restarted pods (docs/cluster.md)
        assert option(cmd, "--nnodes") == str(topo.nodes)
        assert option(cmd, "--nproc_per_node") == str(topo.ranks_per_node)
        assert option(cmd, "--node_rank") == str(rank)
        assert option(cmd, "--rdzv_backend") == "c10d"
        assert option(cmd, "--rdzv_endpoint") == "dcn-master-0:29500"
        assert option(cmd, "--rdzv_id") == "dcn"
        assert option(cmd, "--max-restarts") == "3"
        assert cmd[cmd.index("-m", 3) + 1 :] == ["dlrm.train", *overrides, "hydra.run.dir=outputs/dcn"]


def test_pods_source_the_fabric_env_file():
    job = job_for("topology=dgx_h100_multinode", "--fabric-env", "nccl_socket", "checkpoint.at_end=false")
    c = container(job, "Worker")
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["FABRIC_ENV"] == "nccl_socket" and env["DLRM_ACCEL"] == "cuda"
    r = subprocess.run(
        c["command"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**pod_env(), **env, "DRY_RUN": "1", "RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "29500"},
    )
    assert r.returncode == 0, r.stderr
    assert "fabric env: launch/env/nccl_socket.sh" in r.stderr and "NCCL_IB_DISABLE=1" in r.stderr


def test_cpu_topology_requests_no_gpu_and_uses_gloo():
    overrides = ["topology=cpu_2x2"]
    topo = compose(overrides).topology
    job = job_for("--rdma-resource", "none", "--pvc", "outs", *overrides)
    c = container(job, "Worker")
    assert c["resources"]["limits"] == {}
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["FABRIC_ENV"] == "gloo_cpu" and env["DLRM_ACCEL"] == "cpu"
    cmd = pod_torchrun(job, "Master", 0)
    assert option(cmd, "--nnodes") == str(topo.nodes) and option(cmd, "--nproc_per_node") == str(topo.ranks_per_node)


def test_launcher_sized_topology_takes_nproc_per_node_and_one_node_has_no_workers():
    job = job_for("--nproc-per-node", "4", "topology=cpu")
    assert list(job["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert option(pod_torchrun(job, "Master", 0), "--nproc_per_node") == "4"


def test_options_host_network_pvc_rdma_and_gpu_resource():
    job = job_for(
        "--host-network",
        "--pvc",
        "dlrm-outputs",
        "--rdma-resource",
        "nvidia.com/rdma_vf",
        "--rdma-count",
        "8",
        "--gpu-resource",
        "amd.com/gpu",
        "--namespace",
        "ml",
        "--log-dir",
        "outputs/logs",
        "topology=dgx_h100_multinode",
    )
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"name": "outputs", "persistentVolumeClaim": {"claimName": "dlrm-outputs"}} in pod["volumes"]
    limits = container(job, "Worker")["resources"]["limits"]
    assert limits == {"amd.com/gpu": 8, "nvidia.com/rdma_vf": 8}
    assert job["metadata"]["namespace"] == "ml"
    env = {e["name"]: e["value"] for e in container(job, "Master")["env"]}
    assert env["PET_LOG_DIR"] == "outputs/logs" and env["PET_TEE"] == "3"


def run_cli(*argv: str, out: Path | None = None) -> subprocess.CompletedProcess:
    extra = ["--out", str(out)] if out else []
    return subprocess.run([sys.executable, str(RENDER), *extra, *argv], capture_output=True, text=True, timeout=60)


def test_cli_writes_the_manifest(tmp_path):
    out = tmp_path / "job.yaml"
    r = run_cli("topology=dgx_h100_multinode", "topology.nodes=3", "--pvc", "outs", out=out)
    assert r.returncode == 0, r.stderr
    job = yaml.safe_load(out.read_text())
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            ["--nodes", "3", "topology=dgx_h100_multinode"],
            "--nodes=3 but topology 'dgx_h100_multinode' has 2 node.*pass topology.nodes=3 or --nodes=2",
        ),
        (["--nodes", "4", "topology=dgx_h100_multinode", "topology.nodes=2"], "pass topology.nodes=4 or --nodes=2"),
        (
            ["--nproc-per-node", "4", "topology=dgx_h100_multinode"],
            "--nproc-per-node=4 but .* 8 ranks per node.*topology.ranks_per_node=4 or --nproc-per-node=8",
        ),
        (["topology=cpu"], "ranks_per_node=null.*pass --nproc-per-node=N or topology.ranks_per_node=N"),
        (["topology=dgx_h100_multinode", "topology.nodes=0"], "'topology.nodes' = 0 is invalid: it must be a positive"),
        (["topology=dgx_h100_multinode", "topology.nodes=two"], "'topology.nodes' is invalid: Value 'two'.*Integer"),
        (["topology=nope"], "unknown option 'nope' for config group 'topology'; choose one of: .*dgx_h100"),
        (["topology=dgx_h100", "trainer.max_step=3"], "unknown config key 'trainer.max_step'; did you mean"),
        (["--fabric-env", "nccl_xx", "topology=dgx_h100"], "--fabric-env=nccl_xx: .*choose one of: .*nccl_ib"),
        (["--name", "DLRM_job", "topology=dgx_h100"], "--name=DLRM_job is not a DNS-1123 label"),
        (["--max-restarts", "-1", "topology=dgx_h100"], "--max-restarts=-1 is negative"),
        # hostile: YAML smuggled through a newline, names that pass a `$`-anchored match
        (["topology=dgx_h100", "trainer.max_steps=5\n---\nkind: Pod"], "control character '\\\\n'"),
        (["--name", "dlrm\n", "topology=dgx_h100"], "control character|not a DNS-1123 label"),
        (["--pvc", "data\n", "topology=dgx_h100"], "control character|not a valid claim name"),
        (["--namespace", "team a", "topology=dgx_h100"], "--namespace='team a' is not a DNS-1123 label"),
        # several pods that save checkpoints, with no filesystem in common
        (
            ["topology=dgx_h100_multinode"],
            "topology 'dgx_h100_multinode' has 2 nodes and the job saves checkpoints \\(checkpoint.at_end=true\\), "
            "but without --pvc .* pass --pvc CLAIM .* or checkpoint.at_end=false",
        ),
        (
            ["topology=dgx_h100_multinode", "checkpoint.at_end=false", "checkpoint.every_steps=100"],
            "saves checkpoints \\(checkpoint.every_steps=100\\)",
        ),
        (
            ["--pvc", "outs", "topology=dgx_h100_multinode", "checkpoint.dir=/scratch/ckpt"],
            "checkpoint.dir=/scratch/ckpt is outside outputs/, where --pvc mounts",
        ),
        (
            ["-cd", "no/such/dir", "topology=dgx_h100"],
            "config directory .*no/such/dir \\(-cd/--config-dir\\) not found",
        ),
        (["--data-pvc", "Data", "topology=dgx_h100"], "--data-pvc=Data is not a valid claim name"),
        (["--data-pvc", "data", "--data-mount", "data", "topology=dgx_h100"], "--data-mount=data is not an absolute"),
    ],
)
def test_refusals_name_the_key_and_the_fix_and_write_nothing(tmp_path, capsys, argv, match):
    """The render's main in this process (the fresh command's output: test_cli_refusal_is_one_line_alone)."""
    out = tmp_path / "job.yaml"
    out.write_text("previous: manifest\n")  # a refused render leaves an existing file alone
    code = render.main(["--out", str(out), *argv])
    stdout, stderr = capsys.readouterr()
    assert_refused(code, stdout, stderr, match)
    assert out.read_text() == "previous: manifest\n"
    assert [p.name for p in tmp_path.iterdir()] == ["job.yaml"]  # no temporary file left behind


def assert_refused(code: int, stdout: str, stderr: str, match: str) -> None:
    """Exit 2, nothing on stdout, one `error:` line on stderr matching `match`."""
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert re.search(match, lines[0]), lines[0]
    assert stdout == ""


def test_cli_refusal_is_one_line_alone(tmp_path):
    """A fresh `python launch/k8s/render.py` refuses with its one line: nothing else (an import's warning,
    a traceback) reaches stderr, and the existing manifest stays."""
    out = tmp_path / "job.yaml"
    out.write_text("previous: manifest\n")
    r = run_cli("--nodes", "4", "topology=dgx_h100_multinode", "topology.nodes=2", out=out)
    assert_refused(r.returncode, r.stdout, r.stderr, "pass topology.nodes=4 or --nodes=2")
    assert out.read_text() == "previous: manifest\n" and [p.name for p in tmp_path.iterdir()] == ["job.yaml"]


@pytest.mark.parametrize(
    "value",
    [
        "x: 1",
        "'quoted'",
        '"double"',
        "a #comment",
        "[1, 2]",
        "{k: v}",
        "&anchor",
        "*alias",
        "--- doc",
        "!!python/object",
    ],
)
def test_any_printable_override_stays_one_string_of_one_document(value):
    """Whatever printable text an override holds, it is either refused in one line (the config check
    dlrm.train makes: Hydra cannot parse it, or it is not a string) or the manifest parses as one
    PyTorchJob whose container args hold it verbatim: quoting is YAML's (safe_dump), never our own."""
    argv = ["topology=dgx_h100", f"data.criteo.dir={value}"]
    try:
        text = render.render(render.parse_args(argv), argv)
    except render.RenderError as e:
        assert "\n" not in str(e) and ("cannot parse the override" in str(e) or "data.criteo.dir" in str(e)), e
        return
    docs = list(yaml.safe_load_all(text))
    assert len(docs) == 1 and docs[0]["kind"] == "PyTorchJob"
    assert f"data.criteo.dir={value}" in container(docs[0], "Master")["command"]


def test_one_pod_or_no_checkpoint_needs_no_shared_claim():
    assert "Worker" not in job_for("topology=dgx_h100")["spec"]["pytorchReplicaSpecs"]  # one pod saves alone
    job_for("topology=dgx_h100_multinode", "checkpoint.at_end=false")
    pod = job_for("--pvc", "outs", "topology=dgx_h100_multinode", "checkpoint.dir=outputs/ckpt")
    assert pod["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_a_team_config_directory_and_data_claim_reach_every_pod(tmp_path):
    """-cd DIR / -cn NAME compose here as dlrm.train will (a topology of DIR sizes the job) and go to every
    pod's run_multinode.sh, whose topology check finds DIR too; --data-pvc mounts the data read-only."""
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "team.yaml").write_text(
        "defaults:\n  - dgx_h100_multinode\n  - _self_\nname: team\nnodes: 3\n"
    )
    (tmp_path / "team.yaml").write_text("defaults:\n  - config\n  - override topology: team\n  - _self_\n")
    argv = ["--pvc", "outs", "--data-pvc", "clicks", "-cd", str(tmp_path), "-cn", "team", "trainer.max_steps=5"]
    job = job_for(*argv)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # nodes 3, from DIR's topology
    c = container(job, "Worker")
    assert c["command"][4:] == ["-cd", str(tmp_path), "-cn", "team", "trainer.max_steps=5"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in c["volumeMounts"]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "clicks", "readOnly": True}} in pod["volumes"]
    cmd = pod_torchrun(job, "Worker", 2)
    assert option(cmd, "--nnodes") == "3"
    assert cmd[cmd.index("-m", 3) + 1 :] == ["dlrm.train", "-cd", str(tmp_path), "-cn", "team", "trainer.max_steps=5",
                                             "hydra.run.dir=outputs/dlrm"]  # fmt: skip


def test_names_are_matched_whole():
    assert render.NAME_RE.fullmatch("dlrm-dcn") and not render.NAME_RE.fullmatch("dlrm\n")
