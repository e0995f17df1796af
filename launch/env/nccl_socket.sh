# NCCL over TCP sockets only: clusters without InfiniBand/RoCE (plain Ethernet, most cloud VMs without EFA).
# Check with NCCL_DEBUG=INFO: the log should show "NET/Socket" on the interface you meant.
# Every value is a default: a variable already in your environment wins.
# shellcheck source=launch/env/nccl_base.sh
source "$(dirname "${BASH_SOURCE[0]}")/nccl_base.sh"

# NCCL_IB_DISABLE: 1 = never try the IB verbs transport.
: "${NCCL_IB_DISABLE:=1}"; export NCCL_IB_DISABLE
# NCCL_SOCKET_IFNAME (see nccl_base.sh): here it carries all inter-node data, so name the fast interface
# when there are several, e.g. NCCL_SOCKET_IFNAME=ens5 (GLOO_SOCKET_IFNAME follows it).
# NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD: CPU threads and sockets per connection (product <= 64).
# More of both fills 100 Gb/s links; the defaults (1 x 1 on most hosts) suit 10-25 Gb/s.
: "${NCCL_SOCKET_NTHREADS:=4}"; export NCCL_SOCKET_NTHREADS
: "${NCCL_NSOCKS_PERTHREAD:=4}"; export NCCL_NSOCKS_PERTHREAD
