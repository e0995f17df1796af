# NCCL and torch.distributed settings for any GPU run (sourced by nccl_ib.sh and nccl_socket.sh;
# the default FABRIC_ENV of launch/run_node.sh on GPUs). Source it yourself with `source launch/env/nccl_base.sh`.
# Every value is a default: a variable already in your environment wins (`: "${VAR:=default}"`).

# NCCL_DEBUG: NCCL's log level: VERSION | WARN | INFO | TRACE. INFO prints the chosen transports
# (NVLink/P2P, NET/IB with GDRDMA, NET/Socket) at start: the first thing to check on a new cluster.
: "${NCCL_DEBUG:=WARN}"; export NCCL_DEBUG
# NCCL_DEBUG_SUBSYS: which subsystems log at INFO, e.g. INIT,NET,GRAPH,ENV (unset = NCCL's default INIT,ENV).
if [ -n "${NCCL_DEBUG_SUBSYS:-}" ]; then export NCCL_DEBUG_SUBSYS; fi

# TORCH_NCCL_ASYNC_ERROR_HANDLING: what a rank does when a collective fails or times out:
# 0 nothing (hangs), 1 abort the communicator and kill the process, 2 only abort, 3 kill without cleanup
# (torch's default). 1 lets torchrun see the failure and stop the whole job.
: "${TORCH_NCCL_ASYNC_ERROR_HANDLING:=1}"; export TORCH_NCCL_ASYNC_ERROR_HANDLING
# TORCH_NCCL_TRACE_BUFFER_SIZE: collectives kept by the NCCL flight recorder per rank (0 = off);
# with TORCH_NCCL_DUMP_ON_TIMEOUT=1 a timed-out rank writes them to TORCH_NCCL_DEBUG_INFO_TEMP_FILE
# (default /tmp/nccl_trace_rank_<rank>), which shows which rank and collective hung.
: "${TORCH_NCCL_TRACE_BUFFER_SIZE:=2000}"; export TORCH_NCCL_TRACE_BUFFER_SIZE
: "${TORCH_NCCL_DUMP_ON_TIMEOUT:=1}"; export TORCH_NCCL_DUMP_ON_TIMEOUT

# NCCL_P2P_LEVEL: farthest path over which GPUs inside a node talk directly (LOC, NVL, PIX, PXB, PHB, SYS);
# unset = NCCL decides from the topology (NVLink/NVSwitch when present). Set NVL to forbid PCIe P2P.
if [ -n "${NCCL_P2P_LEVEL:-}" ]; then export NCCL_P2P_LEVEL; fi
# NCCL_NVLS_ENABLE: NVLink SHARP (in-switch reductions on NVSwitch systems such as DGX H100).
# Unset = NCCL's default (2: use it when the system supports it); 1 makes it mandatory (start-up fails
# on boxes without it); 0 = off (if it fails to initialise or uses too much memory). Not set here.
if [ -n "${NCCL_NVLS_ENABLE:-}" ]; then export NCCL_NVLS_ENABLE; fi

# NCCL_SOCKET_IFNAME: network interfaces for NCCL's bootstrap (and its data, on TCP-only clusters):
# a prefix list (eth,ens), ^ to exclude (^docker,lo), = for exact names (=eth0).
# Unset = NCCL prefers ib*, then anything but lo and docker*. Set it when nodes have several networks.
if [ -n "${NCCL_SOCKET_IFNAME:-}" ]; then export NCCL_SOCKET_IFNAME; fi
# GLOO_SOCKET_IFNAME: the interface for any Gloo process group (one exact name, e.g. eth0). Unset = the
# address of the hostname; set it when the hostname resolves to 127.0.x.x or to the wrong network.
# Defaults to NCCL_SOCKET_IFNAME when that is one plain name.
if [ -z "${GLOO_SOCKET_IFNAME:-}" ] && [[ "${NCCL_SOCKET_IFNAME:-}" =~ ^=?[A-Za-z0-9_.]+$ ]]; then
  GLOO_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME#=}
fi
if [ -n "${GLOO_SOCKET_IFNAME:-}" ]; then export GLOO_SOCKET_IFNAME; fi
