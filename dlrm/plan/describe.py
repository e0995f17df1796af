"""The plan report as text: the sharding plan, memory per rank and communication per iteration."""

from __future__ import annotations

GB = 10**9


def _gb(n: float) -> str:
    return f"{n / GB:.2f}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def format_report(report: dict) -> str:
    """Human-readable plan, per-rank memory and communication summary."""
    tp, mem, cm = report["topology"], report["memory"], report["comms"]
    lines = [
        f"topology {tp['name']}: {tp['nodes']} node(s) x {tp['ranks_per_node']} ranks = {tp['world_size']} ranks "
        f"({tp['device']}, {tp['capacity_GB']:.1f} GB per rank); model: {report['model']['tables']} tables, "
        f"{report['model']['embedding_params'] / 1e9:.2f} G embedding params, "
        f"{report['model']['dense_params'] / 1e6:.2f} M dense params",
        "",
        "sharding plan",
        f"  {'table':<16} {'rows':>12} {'sharding type':<18} {'kernel':<8} ranks",
    ]
    for t in report["plan"]:
        lines.append(
            f"  {t['table']:<16} {t['rows']:>12} {t['sharding_type']:<18} {t['compute_kernel']:<8} {_ranks(t['ranks'])}"
        )
    lines += [
        "",
        f"memory per rank, GB (embedding optimizer {mem['embedding_optimizer']}, dense {mem['dense_optimizer']}; "
        f"capacity: HBM {_gb(mem['hbm_capacity_bytes'])} (topology.hbm_GB), "
        f"host DDR {_gb(mem['ddr_capacity_bytes'])} (topology.ddr_GB))",
        f"  {'rank':>5} {'shard w':>9} {'shard opt':>9} {'repl w':>9} {'repl opt':>9} {'dense':>9} "
        f"{'uvm cache':>9} {'HBM':>9} {'DDR':>9}  fits",
    ]
    for m in mem["per_rank"]:
        dense = m["dense_weights"] + m["dense_grads"] + m["dense_optimizer"]
        lines.append(
            f"  {m['rank']:>5} {_gb(m['sharded_weights']):>9} {_gb(m['sharded_optimizer']):>9} "
            f"{_gb(m['replicated_weights']):>9} {_gb(m['replicated_optimizer']):>9} {_gb(dense):>9} "
            f"{_gb(m['uvm_cache']):>9} {_gb(m['hbm']):>9} {_gb(m['ddr']):>9}  {'yes' if m['fits'] else 'NO'}"
        )
    if mem["uvm_tables"]:
        lines.append(
            "  note: tables kept in host memory by UVM (kernel fused_uvm*, slower lookups): "
            + ", ".join(mem["uvm_tables"])
        )
    ts = cm["time_s"]
    kinds = cm["alltoall_bytes_by_kind_mean"]
    lines += [
        "",
        f"communication per iteration (global batch {cm['global_batch_size']}, {cm['local_batch_size']} per rank; "
        "MB per rank, forward + backward)",
        f"  embedding alltoall sent, mean over ranks: intra-node {_mb(cm['alltoall_bytes_intra_mean'])}, "
        f"inter-node {_mb(cm['alltoall_bytes_inter_mean'])}",
        f"    of which ids {_mb(kinds['ids']['intra'] + kinds['ids']['inter'])}, pooled forward "
        f"{_mb(kinds['pooled_fwd']['intra'] + kinds['pooled_fwd']['inter'])}, gradients backward "
        f"{_mb(kinds['pooled_bwd']['intra'] + kinds['pooled_bwd']['inter'])}",
        f"  busiest rank (sent or received): intra-node {_mb(cm['alltoall_bytes_intra_max'])}, "
        f"inter-node {_mb(cm['alltoall_bytes_inter_max'])}",
        f"  allreduce: {_mb(cm['allreduce_bytes'])} ({cm['allreduce_dense_params']} dense params + "
        f"{cm['allreduce_data_parallel_table_params']} data-parallel table params, fp32)",
        f"  modelled time (dlrm.comms.costmodel): alltoall intra {ts['alltoall_intra_s'] * 1e3:.3f} ms, "
        f"inter {ts['alltoall_inter_s'] * 1e3:.3f} ms, allreduce {ts['allreduce_s'] * 1e3:.3f} ms, "
        f"total {ts['total_s'] * 1e3:.3f} ms",
        f"planner: {report['proposer']} proposer, {report['timings']['planner_s']:.1f} s",
    ]
    return "\n".join(lines)
