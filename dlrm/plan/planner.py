"""Planning without the hardware: TorchRec's planner on the meta-device model, no process group.

`make_plan` runs the trainer's planner (or a cheaper proposer) for the config's topology and returns the
whole report: the plan as `TablePlan` records, memory per rank and communication per iteration.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from dlrm.comms.traffic import comm_summary
from dlrm.config import Config, ConfigError, validate, validate_world
from dlrm.distributed.capacity import capacity_GB, dense_param_count, planner_refusal, precheck_memory
from dlrm.plan.large import is_large, large_world_planner
from dlrm.plan.memory import check_fits, memory_summary

PROPOSERS = ("default", "exact", "greedy", "uniform")


MAX_RANKS = 65536  # the largest world dlrm.plan plans for: beyond any cluster, and the planner's cost grows with it


def world_of(cfg: Config, ranks_per_node: int | None) -> tuple[int, int]:
    """(world size, ranks per node) to plan for.

    Args:
        cfg: the run's config (its topology).
        ranks_per_node: overrides topology.ranks_per_node.

    Raises:
        ConfigError: the shape is unusable, as the launcher's world would be.
    """
    tp = cfg.topology
    if ranks_per_node is not None and ranks_per_node <= 0:
        raise ConfigError(f"--ranks-per-node {ranks_per_node} is invalid: it must be a positive number")
    g = ranks_per_node if ranks_per_node is not None else tp.ranks_per_node
    if g is None:
        raise ConfigError(
            f"config key 'topology.ranks_per_node' = None: topology '{tp.name}' takes it from the launcher, "
            "but planning has no launcher; set topology.ranks_per_node=N or pass --ranks-per-node N"
        )
    if tp.ranks_per_node is not None and tp.ranks_per_node != g:
        raise ConfigError(
            f"config key 'topology.ranks_per_node' = {tp.ranks_per_node} does not match --ranks-per-node "
            f"{ranks_per_node}: drop one of them or make them equal"
        )
    world = tp.nodes * g
    if world > MAX_RANKS:
        raise ConfigError(
            f"topology.nodes x ranks per node = {tp.nodes} x {g} = {world:,} ranks, beyond the {MAX_RANKS:,} "
            "that dlrm.plan plans for; give a real cluster's size (topology.nodes, --ranks-per-node)"
        )
    validate_world(cfg, world, g)  # global batch divisible by the world size, etc.
    return world, g


def run_planner(cfg: Config, model, world: int, ranks_per_node: int, proposer: str = "default"):
    """TorchRec's ShardingPlan for `model` (on meta) on `world` ranks, no process group.

    Args:
        cfg: the run's config.
        model: the model on the meta device.
        world, ranks_per_node: the shape to plan for.
        proposer: 'exact' (the trainer's planner), 'default' (the same up to LARGE_WORLD ranks, a narrowed
            search above), 'greedy' or 'uniform' (one cheaper proposer; the plan may differ).

    Returns:
        The ShardingPlan.
    """
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.types import PlannerError

    from dlrm.distributed.sharding import OrderedUniformProposer, plan_sharding, sharders
    from dlrm.distributed.topology import planner_topology

    topology = planner_topology(cfg.topology, world, ranks_per_node)
    one = {"default": None, "exact": None, "greedy": GreedyProposer, "uniform": OrderedUniformProposer}[proposer]
    try:
        if is_large(world, proposer):
            return large_world_planner(cfg, topology).plan(model, sharders(cfg))
        return plan_sharding(cfg, model, topology, pg=None, proposer=one() if one else None)
    except PlannerError as e:
        raise planner_refusal(cfg, world, e) from e


def make_plan(cfg: Config, ranks_per_node: int | None = None, proposer: str = "default") -> dict:
    """The plan report that `--json` prints.

    Args:
        cfg: the run's config.
        ranks_per_node: overrides topology.ranks_per_node.
        proposer: as `run_planner`.

    Returns:
        dict with the plan's tables, memory per rank and communication per iteration.

    Raises:
        ConfigError: the config is invalid. PlanError: nothing fits.
    """
    validate(cfg)
    world, g = world_of(cfg, ranks_per_node)
    if proposer not in PROPOSERS:
        raise ConfigError(f"--proposer {proposer!r} is invalid: choose one of {', '.join(PROPOSERS)}")
    timings = {}
    t0 = time.perf_counter()
    from dlrm.distributed.sharding import table_plans
    from dlrm.models.dlrm import build_model
    from dlrm.optim.optimizers import fuse_embedding_optimizer

    model = build_model(cfg.model)  # meta device: no table memory
    fuse_embedding_optimizer(model, cfg.optim.embedding)  # as the trainer: the planner sees its state size
    dense_params = dense_param_count(model)
    timings["build_s"] = time.perf_counter() - t0
    precheck_memory(cfg, world, dense_params)
    t0 = time.perf_counter()
    plan = run_planner(cfg, model, world, g, proposer)
    timings["planner_s"] = time.perf_counter() - t0
    tables = table_plans(plan, cfg.model, world)
    memory = memory_summary(cfg, tables, world, dense_params)
    check_fits(memory, cfg)
    comms = comm_summary(cfg, tables, world, g, dense_params)
    return {
        "model": {
            "tables": len(cfg.model.tables),
            "embedding_params": sum(t.rows * t.dim for t in tables),
            "dense_params": dense_params,
        },
        "topology": {
            "name": cfg.topology.name,
            "nodes": cfg.topology.nodes,
            "ranks_per_node": g,
            "world_size": world,
            "device": cfg.topology.device,
            "capacity_GB": capacity_GB(cfg),
        },
        "proposer": proposer,
        "search": "narrowed (dlrm.plan.large)" if is_large(world, proposer) else "full",
        "plan": [asdict(t) | ({"shards": []} if t.sharding_type == "data_parallel" else {}) for t in tables],
        "memory": memory,
        "comms": comms,
        "timings": timings,
    }
