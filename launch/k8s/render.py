#!/usr/bin/env python3
"""Render a Kubeflow training-operator PyTorchJob (kubeflow.org/v1) for one topology config.

    python launch/k8s/render.py --image REGISTRY/dlrm:TAG --pvc dlrm-outputs [options] topology=dgx_h100_multinode \
        topology.nodes=4 experiment=dcn_small > job.yaml && kubectl apply -f job.yaml

Every node runs the repository's image (Dockerfile) and, in it, `launch/run_multinode.sh` with the
job's arguments: Hydra overrides, and `-cd DIR` / `-cn NAME` for a team's config directory (at the same
path under /opt/dlrm in the image as here under the repository root). The same torchrun command (c10d
rendezvous on the Master pod, started by `python -m dlrm.torchrun`) and the same fabric env file
(launch/env/$FABRIC_ENV.sh) as on bare metal or under SLURM. One pod per node: Master (hosts the
rendezvous) + nodes-1 Workers, each requesting `ranks_per_node` GPUs and RDMA devices.

Nodes and ranks per node come from the config dlrm.train composes from the same arguments
(dlrm.config.compose: the same checks, the same "did you mean"); --nodes / --nproc-per-node, when given,
must agree with them. Several pods that save checkpoints need --pvc (a claim every pod mounts at
outputs/): each rank writes its shards there. A disagreement is refused (one `error:` line naming the
key and the fix, exit 2) before anything is written.
Needs the repository's config dependencies (Hydra, OmegaConf, PyYAML), not torch.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path, PurePosixPath

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # dlrm from this checkout, also without an install

from dlrm.common.io import write_atomic  # noqa: E402

ENV_DIR = ROOT / "launch" / "env"
WORKDIR = "/opt/dlrm"  # the Dockerfile's WORKDIR
PORT = 29500  # MASTER_PORT default of launch/run_multinode.sh
# Resource name of the RDMA device plugin (Mellanox/NVIDIA k8s-rdma-shared-dev-plugin's default);
# SR-IOV clusters use e.g. nvidia.com/rdma_vf or an operator-specific name: --rdma-resource.
RDMA_RESOURCE = "rdma/hca_shared_devices_a"
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?")  # DNS-1123 label, short enough for pod names (fullmatch)
DATA_MOUNT = "/data"
NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # DNS-1123 label (fullmatch)


class RenderError(ValueError):
    """A refused input; the message names the key, the value and the fix."""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="launch/k8s/render.py",
        description="Render a Kubeflow PyTorchJob that runs launch/run_multinode.sh on every node.",
    )
    p.add_argument(
        "--name", default="dlrm", help="job name: pod names, rendezvous id, run dir outputs/NAME (default dlrm)"
    )
    p.add_argument("--namespace", default=None, help="metadata.namespace (default: kubectl's current one)")
    p.add_argument(
        "--image", default="dlrm:latest", help="image built from the repository's Dockerfile (default dlrm:latest)"
    )
    p.add_argument("--nodes", type=int, default=None, help="pods (= nodes); must equal the topology's nodes")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="ranks per pod; must equal topology.ranks_per_node (required when that is null)",
    )
    p.add_argument(
        "--fabric-env",
        default=None,
        help="launch/env/NAME.sh sourced before torchrun (default nccl_ib on GPUs, gloo_cpu on CPUs)",
    )
    p.add_argument(
        "--gpu-resource",
        default="nvidia.com/gpu",
        help="device plugin resource of one GPU (default nvidia.com/gpu; amd.com/gpu on ROCm clusters)",
    )
    p.add_argument(
        "--rdma-resource",
        default=RDMA_RESOURCE,
        help=f"RDMA device plugin resource to request, or none (default {RDMA_RESOURCE})",
    )
    p.add_argument("--rdma-count", type=int, default=1, help="units of --rdma-resource per pod (default 1)")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="torchrun restarts of the whole job after a rank fails (elasticPolicy.maxRestarts; default 3)",
    )
    p.add_argument(
        "--host-network",
        action="store_true",
        help="pods use the node's network (RDMA NICs without a CNI plugin; one job per node)",
    )
    p.add_argument("--shm-size", default="64Gi", help="size of the /dev/shm memory volume (default 64Gi)")
    p.add_argument(
        "--pvc",
        default=None,
        help="PersistentVolumeClaim mounted at outputs/ in every pod: the run directory and checkpoints, shared by "
        "the pods (needed with several nodes that save checkpoints) and kept across restarts (resume)",
    )
    p.add_argument(
        "--log-dir",
        default=None,
        help="torchrun --log-dir (PET_LOG_DIR) with --tee=3: every rank's stdout/stderr in files there "
        "(under outputs/ with --pvc to keep them)",
    )
    p.add_argument(
        "--data-pvc",
        default=None,
        help="PersistentVolumeClaim of the training data, mounted read-only at --data-mount in every pod",
    )
    p.add_argument("--data-mount", default=DATA_MOUNT, help=f"where --data-pvc is mounted (default {DATA_MOUNT})")
    p.add_argument(
        "-cd",
        "--config-dir",
        default=None,
        help="a team's config directory (dlrm.train -cd): composed from here, passed to the pods as given",
    )
    p.add_argument("-cn", "--config-name", default=None, help="the primary config (dlrm.train -cn)")
    p.add_argument("--out", default=None, help="write the manifest here (atomically) instead of stdout")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for dlrm.train, e.g. topology=dgx_h100_multinode")
    return p.parse_intermixed_args(argv)


def load_config(args):
    """The config dlrm.train will compose from these arguments (overrides, -cd, -cn), checked as it checks it."""
    from dlrm.common.errors import UserError
    from dlrm.config import validate
    from dlrm.config.compose import compose

    try:
        cfg = compose(list(args.overrides), args.config_dir, args.config_name)
        validate(cfg)
    except UserError as e:
        raise RenderError(str(e)) from None
    return cfg


def check_shared_checkpoints(args, cfg) -> None:
    """Several pods that save checkpoints need one filesystem for them: --pvc, and checkpoint.dir (if set)
    under outputs/ where it is mounted. Without it each pod writes its ranks' shards to its own outputs/
    and the save fails after training, at the checkpointer's shared-filesystem check."""
    ck, nodes = cfg.checkpoint, cfg.topology.nodes
    saves = [f"checkpoint.{k}=true" for k in ("at_end", "on_signal") if getattr(ck, k)]
    if ck.every_steps:
        saves.append(f"checkpoint.every_steps={ck.every_steps}")
    if nodes == 1 or not saves:
        return
    if args.pvc is None:
        raise RenderError(
            f"topology '{cfg.topology.name}' has {nodes} nodes and the job saves checkpoints ({', '.join(saves)}), but "
            "without --pvc every pod writes its shards to its own outputs/ and the save fails after training: pass "
            "--pvc CLAIM (a ReadWriteMany claim, mounted at outputs/ in every pod), or checkpoint.at_end=false "
            "checkpoint.every_steps=0 checkpoint.on_signal=false"
        )
    outputs = PurePosixPath(WORKDIR, "outputs")
    if ck.dir is not None and not PurePosixPath(WORKDIR, ck.dir).is_relative_to(outputs):
        raise RenderError(
            f"checkpoint.dir={ck.dir} is outside outputs/, where --pvc mounts the claim every pod shares: leave "
            "checkpoint.dir unset (checkpoints go to outputs/NAME/checkpoints) or put it under outputs/"
        )


def positive_int(key: str, value, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value))
        except ValueError:
            raise RenderError(f"{key}={value} is not an integer; {fix}") from None
    if value < 1:
        raise RenderError(f"{key}={value} must be at least 1; {fix}")
    return value


def resolve(args) -> dict:
    """Check the options against the topology; the values the manifest is built from."""
    if not NAME_RE.fullmatch(args.name):
        raise RenderError(
            f"--name={args.name} is not a DNS-1123 label of at most 40 characters; "
            "use lowercase letters, digits and '-', starting with a letter (e.g. --name=dlrm-dcn)"
        )
    cfg = load_config(args)
    name, nodes = cfg.topology.name, cfg.topology.nodes
    if args.nodes is not None and args.nodes != nodes:
        raise RenderError(
            f"--nodes={args.nodes} but topology '{name}' has {nodes} node(s) (topology.nodes); "
            f"pass topology.nodes={args.nodes} or --nodes={nodes}"
        )
    rpn = cfg.topology.ranks_per_node
    if rpn is None:
        if args.nproc_per_node is None:
            raise RenderError(
                f"topology '{name}' has ranks_per_node=null (taken from the launcher); "
                "pass --nproc-per-node=N or topology.ranks_per_node=N"
            )
        rpn = positive_int("--nproc-per-node", args.nproc_per_node, "pass --nproc-per-node=N with N >= 1")
    elif args.nproc_per_node is not None and args.nproc_per_node != rpn:
        raise RenderError(
            f"--nproc-per-node={args.nproc_per_node} but topology '{name}' has {rpn} ranks per node "
            f"(topology.ranks_per_node); pass topology.ranks_per_node={args.nproc_per_node} or --nproc-per-node={rpn}"
        )
    gpu = str(cfg.topology.device) == "cuda"
    fabric = args.fabric_env or ("nccl_ib" if gpu else "gloo_cpu")
    if not (ENV_DIR / f"{fabric}.sh").is_file():
        known = " ".join(sorted(p.stem for p in ENV_DIR.glob("*.sh")))
        raise RenderError(f"--fabric-env={fabric}: no file launch/env/{fabric}.sh; choose one of: {known}")
    if args.max_restarts < 0:
        raise RenderError(f"--max-restarts={args.max_restarts} is negative; pass 0 (no restart) or more")
    if args.rdma_resource != "none" and args.rdma_count < 1:
        raise RenderError(f"--rdma-count={args.rdma_count} must be at least 1; or pass --rdma-resource=none")
    for key, claim in (("--pvc", args.pvc), ("--data-pvc", args.data_pvc)):
        if claim is not None and not NAME_RE.fullmatch(claim):
            raise RenderError(f"{key}={claim} is not a valid claim name; use lowercase letters, digits and '-'")
    if not PurePosixPath(args.data_mount).is_absolute():
        raise RenderError(f"--data-mount={args.data_mount} is not an absolute path; e.g. --data-mount=/data")
    check_shared_checkpoints(args, cfg)
    if args.namespace is not None and not NAMESPACE_RE.fullmatch(args.namespace):
        raise RenderError(
            f"--namespace={args.namespace!r} is not a DNS-1123 label; use lowercase letters, digits and '-'"
        )
    return {"nodes": nodes, "ranks_per_node": rpn, "gpu": gpu, "fabric": fabric}


def container_command(args) -> list:
    """`bash -c` that sets NODE_RANK from the operator's RANK (pod index) and execs run_multinode.sh with
    the config directory and name (-cd, -cn) and the overrides.

    The training operator sets MASTER_ADDR (the Master pod's service) and MASTER_PORT in every pod.
    """
    script = 'NODE_RANK="$RANK" exec launch/run_multinode.sh "$@"'
    config = [
        *(["-cd", args.config_dir] if args.config_dir else []),
        *(["-cn", args.config_name] if args.config_name else []),
    ]
    return ["bash", "-c", script, "run_multinode", *config, *args.overrides]


def pod_template(name: str, args, r: dict) -> dict:
    env = {
        "NNODES": str(r["nodes"]),
        "NPROC_PER_NODE": str(r["ranks_per_node"]),
        "RDZV_ID": name,  # run directory outputs/NAME on every pod and across restarts
        "FABRIC_ENV": r["fabric"],
        "MAX_RESTARTS": str(args.max_restarts),
        "DLRM_ACCEL": "cuda" if r["gpu"] else "cpu",  # torch's ROCm build answers to 'cuda' as well
        "LOGLEVEL": "INFO",  # torchrun's agent logs its group_rank (rank 0 lives on group_rank 0)
    }
    if args.log_dir:  # torchrun reads any of its options from PET_<OPTION> when not on its command line
        env.update(PET_LOG_DIR=args.log_dir, PET_TEE="3")
    limits = {}
    if r["gpu"]:
        limits[args.gpu_resource] = r["ranks_per_node"]
    if args.rdma_resource != "none":
        limits[args.rdma_resource] = args.rdma_count
    mounts = [{"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": args.shm_size}}]
    if args.pvc:
        mounts.append({"name": "outputs", "mountPath": f"{WORKDIR}/outputs"})
        volumes.append({"name": "outputs", "persistentVolumeClaim": {"claimName": args.pvc}})
    if args.data_pvc:
        mounts.append({"name": "data", "mountPath": args.data_mount, "readOnly": True})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": args.data_pvc, "readOnly": True}})
    container = {
        "name": "pytorch",  # the operator injects MASTER_ADDR/MASTER_PORT into the container of this name
        "image": args.image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": WORKDIR,
        "command": container_command(args),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "pytorchjob-port", "containerPort": PORT}],
        "resources": {"limits": limits, "requests": dict(limits)},
        "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},  # pin memory for RDMA
        "volumeMounts": mounts,
    }
    spec = {"containers": [container], "volumes": volumes}
    if args.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return {"spec": spec}


def manifest(args) -> dict:
    r = resolve(args)
    name = args.name
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": pod_template(name, args, r)}}
    if r["nodes"] > 1:
        replicas["Worker"] = {
            "replicas": r["nodes"] - 1,
            "restartPolicy": "OnFailure",
            "template": pod_template(name, args, r),
        }
    metadata = {"name": name, "labels": {"app": "dlrm"}}
    if args.namespace:
        metadata["namespace"] = args.namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata,
        "spec": {
            # Fixed size: the topology fixes nodes x ranks_per_node, so "elastic" means restarts, not resizing.
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvHost": f"{name}-master-0",
                "rdzvPort": PORT,
                "rdzvId": name,
                "minReplicas": r["nodes"],
                "maxReplicas": r["nodes"],
                "maxRestarts": args.max_restarts,
            },
            "nprocPerNode": str(r["ranks_per_node"]),
            # Keep finished pods so `kubectl logs` still reads every node's log.
            "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": args.max_restarts},
            "pytorchReplicaSpecs": replicas,
        },
    }


def refuse_control_characters(argv) -> None:
    """Every argument ends up in the manifest (the header comment, the container's args): a newline or
    other control character could end a comment or a scalar and smuggle in YAML of its own."""
    for arg in argv:
        bad = next((c for c in arg if ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:
            raise RenderError(f"argument {arg!r} holds the control character {bad!r}; remove it")


def render(args, argv) -> str:
    refuse_control_characters(argv)
    header = (
        "# Generated by launch/k8s/render.py "
        + " ".join(shlex.quote(a) for a in argv)
        + "\n# Do not edit by hand: change the options or the topology config and render again.\n"
    )
    return header + yaml.safe_dump(manifest(args), sort_keys=False, default_flow_style=False)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        text = render(args, argv)
        if args.out:
            if not Path(args.out).parent.is_dir():
                raise RenderError(
                    f"--out={args.out}: directory {Path(args.out).parent} does not exist; create it first"
                )
            write_atomic(args.out, text.encode())
        else:
            sys.stdout.write(text)
    except (RenderError, OSError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
