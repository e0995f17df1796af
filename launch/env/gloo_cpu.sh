# Gloo on CPUs: CPU ranks on one machine or CPU-only nodes over TCP (topology=cpu, cpu_2x2).
# The default FABRIC_ENV of launch/run_node.sh and launch/run_multinode.sh on CPU machines
# (launch/run_cpu.sh sources none unless FABRIC_ENV is set).
# Every value is a default: a variable already in your environment wins.

# GLOO_SOCKET_IFNAME: the interface Gloo binds to (one exact name: eth0, lo). Unset = the address of the
# hostname, right on one machine; across machines set it when the hostname resolves to 127.0.x.x
# (Debian's /etc/hosts does this) or to the wrong network: the symptom is a hang or "Connection refused" at start.
if [ -n "${GLOO_SOCKET_IFNAME:-}" ]; then export GLOO_SOCKET_IFNAME; fi
# OMP_NUM_THREADS: intra-op threads per rank. torchrun sets 1 for several ranks (and warns); raise it to
# cores / ranks per node when the machine has cores to spare.
: "${OMP_NUM_THREADS:=1}"; export OMP_NUM_THREADS
