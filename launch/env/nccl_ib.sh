# NCCL over InfiniBand or RoCE with GPUDirect RDMA (NIC reads and writes GPU memory directly):
# DGX H100 / SuperPOD, ZionEX-like RoCE clusters. The default FABRIC_ENV of launch/run_multinode.sh on GPUs.
# Check with NCCL_DEBUG=INFO: the log should show "NET/IB" and "GDRDMA" for the inter-node channels.
# Every value is a default: a variable already in your environment wins.
# shellcheck source=launch/env/nccl_base.sh
source "$(dirname "${BASH_SOURCE[0]}")/nccl_base.sh"

# NCCL_IB_DISABLE: 0 = use the IB verbs transport (InfiniBand and RoCE); 1 = fall back to TCP sockets.
: "${NCCL_IB_DISABLE:=0}"; export NCCL_IB_DISABLE
# NCCL_IB_HCA: which RDMA devices (and ports) NCCL uses: mlx5_0,mlx5_1 (prefixes), =mlx5_0:1 (exact
# device:port), ^mlx5_4 (exclude). Left unset, NCCL takes every active RDMA device, the storage and
# in-band management NICs too (on a DGX H100 a dual-port ConnectX-7 in Ethernet mode beside the 8 compute
# NICs, which pair one to one with the GPUs). So when it is unset and the node has active ports of both
# link layers, this file picks the active InfiniBand ports (=mlx5_0:1,mlx5_3:1,...: the compute fabric)
# and prints the pick; where every port is InfiniBand (or every port is RoCE) it leaves the choice to
# NCCL, which cannot tell a storage NIC from a compute one: name yours. Override: set NCCL_IB_HCA (list
# the devices with `ibv_devinfo` or `ibdev2netdev`; `nvidia-smi topo -m` shows each GPU's nearest NIC).
# IB_SYSFS: where the RDMA devices are listed (default /sys/class/infiniband; the tests point it at a copy).
ib_compute_ports() {
  local port ib=() eth=()
  for port in "${IB_SYSFS:-/sys/class/infiniband}"/*/ports/*; do
    [ -r "$port/link_layer" ] && [ -r "$port/state" ] || continue
    case "$(cat "$port/state")" in *ACTIVE*) ;; *) continue ;; esac
    local dev=${port%/ports/*}
    case "$(cat "$port/link_layer")" in
      InfiniBand) ib+=("${dev##*/}:${port##*/}") ;;
      Ethernet) eth+=("${dev##*/}:${port##*/}") ;;
    esac
  done
  if [ ${#ib[@]} -gt 0 ] && [ ${#eth[@]} -gt 0 ]; then
    local IFS=,
    printf '=%s' "${ib[*]}"
  fi
}
if [ -z "${NCCL_IB_HCA:-}" ]; then
  NCCL_IB_HCA=$(ib_compute_ports)
  [ -z "$NCCL_IB_HCA" ] || echo "NCCL_IB_HCA=$NCCL_IB_HCA: the active InfiniBand ports, not the Ethernet (storage) ones (set NCCL_IB_HCA to choose)" >&2
fi
if [ -n "${NCCL_IB_HCA:-}" ]; then export NCCL_IB_HCA; else unset NCCL_IB_HCA; fi
# NCCL_NET_GDR_LEVEL: farthest PCIe path between GPU and NIC over which GPUDirect RDMA is used:
# LOC (never), PIX (same PCIe switch), PXB (through several switches), PHB (same CPU), SYS (across CPUs).
# Unset = NCCL decides from the topology. Raise to PHB/SYS if the log lacks GDRDMA and your platform supports it.
if [ -n "${NCCL_NET_GDR_LEVEL:-}" ]; then export NCCL_NET_GDR_LEVEL; fi
# NCCL_NET_GDR_READ: 1 = send from GPU memory by RDMA read as well (helps on NVLink systems), 0 = stage sends through host.
: "${NCCL_NET_GDR_READ:=1}"; export NCCL_NET_GDR_READ
# NCCL_IB_GID_INDEX: RoCE only: the GID table entry, i.e. RoCE v1/v2 and IPv4/IPv6 address. Unset = NCCL picks
# (NCCL >= 2.21 chooses RoCE v2 over IPv4); older NCCL often needs 3. Inspect with `show_gids`.
if [ -n "${NCCL_IB_GID_INDEX:-}" ]; then export NCCL_IB_GID_INDEX; fi
# NCCL_IB_TC / NCCL_IB_SL: RoCE traffic class / IB service level, to put NCCL in the lossless (PFC/ECN) queue
# your switches reserve for it (e.g. NCCL_IB_TC=106 on many RoCE fabrics). Unset = 0.
if [ -n "${NCCL_IB_TC:-}" ]; then export NCCL_IB_TC; fi
if [ -n "${NCCL_IB_SL:-}" ]; then export NCCL_IB_SL; fi
# NCCL_IB_TIMEOUT: IB verbs retransmission timeout, 4.096 us x 2^N. Raise (22-23) on large or congested fabrics
# that report "NET/IB : Got completion with error 12" (retry exceeded).
: "${NCCL_IB_TIMEOUT:=22}"; export NCCL_IB_TIMEOUT
# NCCL_IB_RETRY_CNT: verbs retries before that error (7 is the maximum and NCCL's default).
: "${NCCL_IB_RETRY_CNT:=7}"; export NCCL_IB_RETRY_CNT
# NCCL_IB_QPS_PER_CONNECTION: queue pairs per connection; 2-4 spreads traffic over more paths (ECMP on RoCE).
: "${NCCL_IB_QPS_PER_CONNECTION:=1}"; export NCCL_IB_QPS_PER_CONNECTION
# NCCL_CROSS_NIC: whether a ring/tree may leave a node by one NIC index and enter the next by another:
# 0 = never (rail-optimised fabrics: NIC k of every node on the same leaf switch), 1 = allow, 2 = NCCL decides (default).
: "${NCCL_CROSS_NIC:=2}"; export NCCL_CROSS_NIC
