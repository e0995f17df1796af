"""Launch scripts in DRY_RUN mode: the torchrun command they print, the variables they refuse,
the fabric env files, and the Dockerfile's pins against pyproject.toml and launch/setup.sh."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as ROOT

LAUNCH = ROOT / "launch"
# Variables the launchers read: cleared so the caller's environment cannot change the expected commands.
LAUNCH_VARS = (
    "NNODES NODE_RANK MASTER_ADDR MASTER_PORT RDZV_ENDPOINT RDZV_ID RUN_DIR NPROC_PER_NODE NGPU NPROC "
    "FABRIC_ENV TORCHRUN DLRM_ACCEL DLRM_VENV TOPOLOGY DRY_RUN MAX_RESTARTS NUMA_BINDING NCCL_IB_HCA IB_SYSFS"
).split()


def launch(script: str, *overrides: str, path_prefix: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """Run launch/<script> with DRY_RUN=1, TORCHRUN=torchrun, DLRM_ACCEL=cpu, NUMA_BINDING=none (whether
    this machine has numactl does not matter) unless `env` says otherwise (None: unset)."""
    full = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}
    full.update(DRY_RUN="1", TORCHRUN="torchrun", DLRM_ACCEL="cpu", NUMA_BINDING="none")
    full.update(env)
    full = {k: v for k, v in full.items() if v is not None}
    if path_prefix is not None:
        full["PATH"] = f"{path_prefix}{os.pathsep}{full['PATH']}"
    return subprocess.run(
        ["bash", str(LAUNCH / script), *overrides], env=full, capture_output=True, text=True, timeout=60
    )


def commands(result: subprocess.CompletedProcess) -> list[list[str]]:
    """The commands echoed as '+ ...' on stderr, each split as the shell would."""
    return [shlex.split(line[2:]) for line in result.stderr.splitlines() if line.startswith("+ ")]


def torchrun_command(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    cmds = [c for c in commands(result) if c[0].endswith("torchrun") or c[1:3] == ["-m", "dlrm.torchrun"]]
    assert len(cmds) == 1, result.stderr
    return cmds[0]


# --- single node ---------------------------------------------------------------------------------


# One node: like --standalone (c10d on a free port: 0), but the rendezvous address is loopback.
LOCAL = ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "--rdzv-id=local"]


def test_run_cpu_prints_the_loopback_command():
    r = launch("run_cpu.sh", "trainer.max_steps=5", "model.bottom_mlp=[64,16]")
    assert torchrun_command(r) == [
        "torchrun",
        *LOCAL,
        "--nproc_per_node=2",
        "-m",
        "dlrm.train",
        "trainer.max_steps=5",
        "model.bottom_mlp=[64,16]",
    ]
    assert "fabric env: none" in r.stderr


def test_run_cpu_uses_the_venv_quiet_torchrun(tmp_path):
    """Without TORCHRUN: DLRM_VENV's python -m dlrm.torchrun (torchrun without its summary for a user error)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/true")
    r = launch("run_cpu.sh", NPROC="3", TORCHRUN=None, DLRM_VENV=str(venv))
    assert torchrun_command(r)[:8] == [str(venv / "bin/python"), "-m", "dlrm.torchrun", *LOCAL, "--nproc_per_node=3"]


def test_run_node_on_cpu_passes_overrides_through():
    r = launch("run_node.sh", "experiment=dcn_small", "sharding=row_wise", NGPU="4")
    assert torchrun_command(r) == [
        "torchrun",
        *LOCAL,
        "--nproc_per_node=4",
        "-m",
        "dlrm.train",
        "experiment=dcn_small",
        "sharding=row_wise",
    ]
    assert "fabric env: launch/env/gloo_cpu.sh" in r.stderr


def test_run_node_on_gpus_defaults_to_8_ranks_and_dgx_h100():
    r = launch("run_node.sh", "experiment=dcn_small", DLRM_ACCEL="cuda")
    assert torchrun_command(r) == [
        "torchrun",
        *LOCAL,
        "--nproc_per_node=8",
        "-m",
        "dlrm.train",
        "experiment=dcn_small",
        "topology=dgx_h100",
    ]
    assert "fabric env: launch/env/nccl_base.sh" in r.stderr
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in r.stderr  # dry runs list the fabric settings


def test_run_node_default_topology_follows_ngpu_and_user_topology_wins():
    r = launch("run_node.sh", DLRM_ACCEL="cuda", NGPU="4")
    assert torchrun_command(r)[-2:] == ["topology=dgx_h100", "topology.ranks_per_node=4"]
    r = launch("run_node.sh", "topology=zion", DLRM_ACCEL="cuda", FABRIC_ENV="nccl_ib")
    assert torchrun_command(r)[-1] == "topology=zion"
    assert "fabric env: launch/env/nccl_ib.sh (FABRIC_ENV=nccl_ib)" in r.stderr


# --- several nodes -------------------------------------------------------------------------------

NODE1 = dict(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", MASTER_PORT="29600", NPROC_PER_NODE="2")


def test_run_multinode_prints_the_c10d_command():
    r = launch("run_multinode.sh", "topology=cpu_2x2", "trainer.max_steps=5", RDZV_ID="job42", **NODE1)
    assert torchrun_command(r) == [
        "torchrun",
        "--nnodes=2",
        "--nproc_per_node=2",
        "--node_rank=1",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=10.0.0.1:29600",
        "--rdzv_id=job42",
        "-m",
        "dlrm.train",
        "topology=cpu_2x2",
        "trainer.max_steps=5",
        "hydra.run.dir=outputs/job42",
    ]
    assert "fabric env: launch/env/gloo_cpu.sh" in r.stderr


def test_run_multinode_run_dir_choices():
    # RUN_DIR names it; a hydra.run.dir override wins; without RDZV_ID the ranks agree through the store.
    r = launch("run_multinode.sh", RUN_DIR="/shared/run1", **NODE1)
    assert torchrun_command(r)[-1] == "hydra.run.dir=/shared/run1"
    r = launch("run_multinode.sh", "hydra.run.dir=/x/y", RDZV_ID="j", **NODE1)
    assert [a for a in torchrun_command(r) if a.startswith("hydra.run.dir=")] == ["hydra.run.dir=/x/y"]
    r = launch("run_multinode.sh", **NODE1)
    cmd = torchrun_command(r)
    assert "--rdzv_id=dlrm" in cmd and not any(a.startswith("hydra.run.dir=") for a in cmd)
    assert "torchrun's store" in r.stderr
    r = launch("run_multinode.sh", SLURM_JOB_ID="991", **NODE1)
    assert {"--rdzv_id=991", "hydra.run.dir=outputs/991"} <= set(torchrun_command(r))
    r = launch("run_multinode.sh", "run.name=exp1", SLURM_JOB_ID="991", **NODE1)  # a named run wins over RUN_DIR
    assert not any(a.startswith("hydra.run.dir=") for a in torchrun_command(r)) and "outputs/exp1" in r.stderr


def test_run_multinode_endpoint_and_gpu_defaults():
    r = launch("run_multinode.sh", NNODES="2", NODE_RANK="0", RDZV_ENDPOINT="head:1234", RDZV_ID="r", DLRM_ACCEL="cuda")
    cmd = torchrun_command(r)
    assert {"--nproc_per_node=8", "--rdzv_endpoint=head:1234", "--node_rank=0"} <= set(cmd)
    assert "fabric env: launch/env/nccl_ib.sh" in r.stderr
    r = launch("run_multinode.sh")  # one node: loopback rendezvous, node rank 0
    assert {"--nnodes=1", "--node_rank=0", "--rdzv_endpoint=127.0.0.1:29500"} <= set(torchrun_command(r))


def test_slurm_sbatch_runs_one_torchrun_per_node(tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu-a01\\ngpu-a02\\n"\n')
    scontrol.chmod(0o755)
    r = launch(
        "slurm.sbatch",
        "topology=dgx_h100_multinode",
        "trainer.max_steps=10",
        path_prefix=tmp_path,
        DLRM_ACCEL="cuda",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu-a[01-02]",
        SLURM_JOB_NUM_NODES="2",
        SLURM_GPUS_ON_NODE="8",
        SLURM_SUBMIT_DIR=str(ROOT),
    )
    assert r.returncode == 0, r.stderr
    srun = [c for c in commands(r) if c[0] == "srun"]
    assert len(srun) == 1 and srun[0][-2:] == ["topology=dgx_h100_multinode", "trainer.max_steps=10"]
    assert {"--nodes=2", "--ntasks-per-node=1"} <= set(srun[0])
    assert torchrun_command(r) == [
        "torchrun",
        "--nnodes=2",
        "--nproc_per_node=8",
        "--node_rank=0",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=gpu-a01:29500",
        "--rdzv_id=4242",
        "-m",
        "dlrm.train",
        "topology=dgx_h100_multinode",
        "trainer.max_steps=10",
        "hydra.run.dir=outputs/slurm-4242",
    ]


def fake_numactl(directory: Path) -> Path:
    numactl = directory / "numactl"
    numactl.write_text('#!/bin/sh\nexec "$@"\n')
    numactl.chmod(0o755)
    return directory


def test_gpu_ranks_are_bound_to_their_numa_node_where_numactl_is(tmp_path):
    """On GPUs torchrun binds each rank to its GPU's NUMA node (--numa-binding=node, which runs numactl);
    without numactl the launcher says it leaves them unbound; NUMA_BINDING chooses or turns it off."""
    for script, env in (("run_node.sh", {}), ("run_multinode.sh", dict(NODE1, NPROC_PER_NODE="8"))):
        cmd = torchrun_command(
            launch(script, path_prefix=fake_numactl(tmp_path), DLRM_ACCEL="cuda", NUMA_BINDING=None, **env)
        )
        assert "--numa-binding=node" in cmd and cmd.index("--numa-binding=node") < cmd.index("-m"), cmd
    r = launch("run_node.sh", DLRM_ACCEL="cuda", NUMA_BINDING="socket", path_prefix=tmp_path)
    assert "--numa-binding=socket" in torchrun_command(r)
    assert not any(
        a.startswith("--numa") for a in torchrun_command(launch("run_node.sh", DLRM_ACCEL="cpu", NUMA_BINDING=None))
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    no_numactl = {"PATH": f"{empty}{os.pathsep}/usr/bin{os.pathsep}/bin"} if not shutil.which("numactl") else None
    if no_numactl is not None:  # a machine with numactl installed cannot show its absence
        r = launch("run_node.sh", DLRM_ACCEL="cuda", NUMA_BINDING=None, **no_numactl)
        assert not any(a.startswith("--numa") for a in torchrun_command(r)) and "install numactl" in r.stderr
        r = launch("run_node.sh", DLRM_ACCEL="cuda", NUMA_BINDING="node", **no_numactl)
        assert r.returncode == 2 and "NUMA_BINDING=node needs the numactl command" in r.stderr
    r = launch("run_node.sh", DLRM_ACCEL="cuda", NUMA_BINDING="everywhere")
    assert r.returncode == 2 and "NUMA_BINDING=everywhere: use node, socket" in r.stderr


def test_a_team_config_directory_reaches_dlrm_train_and_its_topology_is_checked(tmp_path):
    """-cd DIR goes to dlrm.train as given; a topology of DIR is compared with the launcher's sizes as
    one of conf/ is (DIR first, as Hydra searches it)."""
    (tmp_path / "topology").mkdir()
    (tmp_path / "topology" / "team3.yaml").write_text("name: team3\nnodes: 3\nranks_per_node: 2\n")
    argv = ["-cd", str(tmp_path), "topology=team3", "-cn", "config"]
    r = launch("run_multinode.sh", *argv, RDZV_ID="t", **NODE1)
    assert r.returncode == 2 and "NNODES=2 but topology 'team3' has 3 node(s)" in r.stderr
    cmd = torchrun_command(launch("run_multinode.sh", *argv, RDZV_ID="t", **dict(NODE1, NNODES="3")))
    assert cmd[cmd.index("-m") + 1 :] == ["dlrm.train", *argv, "hydra.run.dir=outputs/t"]
    r = launch("run_multinode.sh", f"--config-dir={tmp_path}", "topology=cpu_2x2", RDZV_ID="t", **NODE1)
    assert f"--config-dir={tmp_path}" in torchrun_command(r)  # a conf/ topology, with DIR searched first
    r = launch("run_node.sh", "-cd", str(tmp_path / "nope"))
    assert r.returncode == 2 and f"-cd {tmp_path / 'nope'}: no directory" in r.stderr
    r = launch("run_multinode.sh", "-cd", str(tmp_path), "topology=team4", **NODE1)
    assert r.returncode == 2 and f"no file {tmp_path}/topology/team4.yaml or conf/topology/team4.yaml" in r.stderr
    assert "team3" in r.stderr and "cpu_2x2" in r.stderr  # the choices of both directories


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, overrides, env, message",
    [
        ("run_multinode.sh", [], dict(NODE1, NODE_RANK="2"), "NODE_RANK=2 is not below NNODES=2"),
        ("run_multinode.sh", [], dict(NODE1, NODE_RANK=None), "NODE_RANK is not set"),
        ("run_multinode.sh", [], dict(NODE1, NODE_RANK="-1"), "NODE_RANK=-1 is not an integer"),
        ("run_multinode.sh", [], dict(NODE1, MASTER_ADDR=None), "MASTER_ADDR is not set"),
        ("run_multinode.sh", [], dict(NODE1, NPROC_PER_NODE="two"), "NPROC_PER_NODE=two is not an integer"),
        ("run_multinode.sh", [], dict(NODE1, NNODES="0", NODE_RANK="0"), "NNODES=0 is below 1"),
        ("run_multinode.sh", [], dict(NODE1, MASTER_PORT="70000"), "MASTER_PORT=70000 is not a TCP port"),
        ("run_multinode.sh", [], dict(NODE1, RDZV_ENDPOINT="nohost"), "RDZV_ENDPOINT=nohost is not host:port"),
        ("run_multinode.sh", ["topology=cpu_2x2"], dict(NODE1, NNODES="3"), "NNODES=3 but topology 'cpu_2x2' has 2"),
        ("run_multinode.sh", ["topology=cpu_2x2"], dict(NODE1, NPROC_PER_NODE="4"), "NPROC_PER_NODE=4 but topology"),
        ("run_multinode.sh", ["topology=nope"], NODE1, "topology=nope: no file conf/topology/nope.yaml"),
        ("run_multinode.sh", [], dict(NODE1, FABRIC_ENV="nope"), "FABRIC_ENV=nope: no file launch/env/nope.sh"),
        ("run_node.sh", [], dict(NGPU="0"), "NGPU=0 is below 1"),
        ("run_node.sh", [], dict(NGPU="8x"), "NGPU=8x is not an integer"),
        (
            "run_node.sh",
            ["topology=cpu_2x2"],
            {},
            "topology 'cpu_2x2' has 2 nodes x 2 ranks but this launcher runs one node of NGPU=2",
        ),
        ("run_node.sh", ["topology=dgx_h100"], dict(NGPU="4"), "NGPU=4 but topology 'dgx_h100' has 8 ranks"),
        ("run_node.sh", [], dict(DLRM_ACCEL="tpu"), "DLRM_ACCEL=tpu is not cpu, cuda or rocm"),
        ("run_node.sh", [], dict(DRY_RUN="yes"), "DRY_RUN=yes"),
        ("run_cpu.sh", [], dict(NPROC="zero"), "NPROC=zero is not an integer"),
        ("slurm.sbatch", [], dict(SLURM_SUBMIT_DIR=str(ROOT)), "SLURM_JOB_ID is not set"),
    ],
)
def test_bad_variables_are_refused_with_the_fix(script, overrides, env, message):
    r = launch(script, *overrides, **env)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "+ " not in r.stderr  # nothing was run


# --- fabric env files ----------------------------------------------------------------------------

ENV_FILES = sorted((LAUNCH / "env").glob("*.sh"))


def test_every_env_file_a_launcher_defaults_to_exists():
    """The defaults the launchers load (`load_fabric_env NAME`) name files of launch/env/."""
    named = set()
    for script in [*LAUNCH.glob("*.sh"), LAUNCH / "slurm.sbatch"]:
        named |= set(re.findall(r"load_fabric_env ([a-z0-9_]+)", script.read_text()))
    named.discard("none")  # no file: nothing sourced
    assert named >= {"nccl_base", "nccl_ib", "gloo_cpu"}, named  # the scan still finds the launchers' calls
    assert named <= {f.stem for f in ENV_FILES}, named - {f.stem for f in ENV_FILES}


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_env_file_documents_every_default_and_the_user_wins(path):
    text = path.read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    defaults = re.findall(r': "\$\{(\w+):=([^}]*)\}"; export \1', text)
    for var, _ in defaults:
        assert var in comments, f"{path.name}: {var} is set but not documented"
    script = f"set -euo pipefail; source {shlex.quote(str(path))}; env"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "GLOO_", "TORCH_NCCL_", "OMP_"))}
    plain = subprocess.run(["bash", "-c", script], env=base, capture_output=True, text=True, check=True).stdout
    mine = {var: "user-value" for var, _ in defaults}
    user = subprocess.run(
        ["bash", "-c", script], env={**base, **mine}, capture_output=True, text=True, check=True
    ).stdout
    for var, default in defaults:
        assert f"\n{var}={default}\n" in f"\n{plain}", f"{path.name}: {var} not exported as {default}"
        assert f"\n{var}=user-value\n" in f"\n{user}", f"{path.name}: {var} overrides the user's value"


def test_nccl_ib_picks_the_infiniband_ports_beside_ethernet_ones(tmp_path):
    """A DGX-like node: two active InfiniBand ports (compute), an active Ethernet port (storage), an
    InfiniBand port that is down. Unset, NCCL_IB_HCA becomes the active InfiniBand ports; the user's
    value wins; all-InfiniBand or all-Ethernet nodes are left to NCCL."""

    def port(dev: str, link: str, state: str) -> None:
        (tmp_path / "sys" / dev / "ports" / "1").mkdir(parents=True)
        (tmp_path / "sys" / dev / "ports" / "1" / "link_layer").write_text(link + "\n")
        (tmp_path / "sys" / dev / "ports" / "1" / "state").write_text(f"4: {state}\n")

    def hca(**env: str) -> str:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "IB_SYSFS"))}
        script = f'source {shlex.quote(str(LAUNCH / "env" / "nccl_ib.sh"))}; echo "[${{NCCL_IB_HCA-unset}}]"'
        return subprocess.run(
            ["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, check=True
        ).stdout.strip()

    for dev, link, state in [("mlx5_0", "InfiniBand", "ACTIVE"), ("mlx5_1", "InfiniBand", "ACTIVE"),
                             ("mlx5_4", "Ethernet", "ACTIVE"), ("mlx5_5", "InfiniBand", "DOWN")]:  # fmt: skip
        port(dev, link, state)
    assert hca(IB_SYSFS=str(tmp_path / "sys")) == "[=mlx5_0:1,mlx5_1:1]"
    assert hca(IB_SYSFS=str(tmp_path / "sys"), NCCL_IB_HCA="^mlx5_4") == "[^mlx5_4]"
    (tmp_path / "sys" / "mlx5_4" / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
    assert hca(IB_SYSFS=str(tmp_path / "sys")) == "[unset]"  # all InfiniBand: nothing to tell apart
    assert hca(IB_SYSFS=str(tmp_path / "none")) == "[unset]"


# Every script's syntax and ShellCheck: .ci/lint (shellcheck on every tracked shell script).


# --- container pins ------------------------------------------------------------------------------


def test_dockerfile_pins_agree_with_pyproject_and_setup():
    docker = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", docker, re.M))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    setup = dict(re.findall(r"^(TORCH|TORCHREC)=(\S+)$", (LAUNCH / "setup.sh").read_text(), re.M))

    assert f"torch=={args['TORCH_VERSION']}" in pyproject["dependencies"]
    assert args["TORCH_VERSION"] == setup["TORCH"]
    assert f"fbgemm-gpu=={args['FBGEMM_GPU_VERSION']}" in pyproject["optional-dependencies"]["cuda"]
    assert args["TORCHREC_VERSION"] == setup["TORCHREC"]
    # The base image is PyTorch's image of that very torch, and the installs use the ARGs.
    assert args["BASE_IMAGE"].startswith("pytorch/pytorch:${TORCH_VERSION}-cuda${CUDA_VERSION}-")
    assert 'pip install --no-deps "torchrec==${TORCHREC_VERSION}"' in docker
    assert '"fbgemm-gpu==${FBGEMM_GPU_VERSION}"' in docker
    assert re.search(r'^ENTRYPOINT \["python", "-m", "dlrm.torchrun"\]$', docker, re.M)  # quiet user errors
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.parametrize(
    "cuda, index",
    [
        ("13.0", ""),
        ("12.8", "https://download.pytorch.org/whl/cu128"),
        ("12.6", "https://download.pytorch.org/whl/cu126"),
    ],
)
def test_dockerfile_takes_fbgemm_of_the_cuda_build_arg(cuda, index):
    """--build-arg CUDA_VERSION=12.x: PyTorch's image for that CUDA and fbgemm-gpu from PyTorch's index for it."""
    docker = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", docker, re.M))
    assert args["CUDA_VERSION"] == "13.0" and "--build-arg CUDA_VERSION=12.8" in docker
    (choose,) = re.findall(r'^RUN (if \[ "\$\{CUDA_VERSION\}" = 13\.0 \].*?fi) \\$', docker, re.M)
    env = {"CUDA_VERSION": cuda, "PYTORCH_INDEX": args["PYTORCH_INDEX"], "PATH": os.environ["PATH"]}
    got = subprocess.run(
        ["bash", "-c", f'{choose}; echo "$index"'], env=env, capture_output=True, text=True, check=True
    )
    assert got.stdout.strip() == index
    assert 'pip install --no-deps --index-url "$index" "fbgemm-gpu==${FBGEMM_GPU_VERSION}"' in docker
    # the base image's torch must be that CUDA's build: the check after FROM compares torch.version.cuda
    assert "c.startswith('${CUDA_VERSION}')" in docker


def test_max_restarts_is_passed_to_torchrun_and_checked():
    cmd = torchrun_command(launch("run_node.sh", "trainer.resume=auto", MAX_RESTARTS="2"))
    assert "--max-restarts=2" in cmd and cmd.index("--max-restarts=2") < cmd.index("-m")
    multi = torchrun_command(
        launch(
            "run_multinode.sh", NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.1", NPROC_PER_NODE="2", MAX_RESTARTS="1"
        )
    )
    assert "--max-restarts=1" in multi
    bad = launch("run_node.sh", MAX_RESTARTS="many")
    assert bad.returncode == 2 and "MAX_RESTARTS=many" in bad.stderr
