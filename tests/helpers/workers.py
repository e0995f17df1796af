"""Functions run on each rank by the distributed tests (importable, so spawn can pickle them).

Each builds what it needs in the job's default process group and leaves the group to the harness
(tests/helpers/harness.py), so several of them share one launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dlrm.config import Config, validate, validate_world
from dlrm.distributed.sharding import describe_plan
from dlrm.distributed.world import World
from dlrm.models.dlrm import local_pieces
from tests.helpers.harness import default_group


def build_trainer(cfg: Config):
    """A validated Trainer for this rank (the world from the launcher's environment)."""
    from dlrm.trainer.build import build

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    return build(cfg, world)


def pieces_of(model: torch.nn.Module) -> dict:
    """{param name: [((row offset, col offset), tensor copy), ...]}: this rank's pieces of the weights."""
    return {
        name: [(offsets, t.detach().clone()) for t, offsets, _ in local_pieces(value)]
        for name, value in model.state_dict().items()
    }


def train_and_report(cfg: Config) -> dict:
    """Train on this rank; the logged losses, this rank's pieces of the final weights (`pieces_of`),
    the plan (dlrm.distributed.sharding.describe_plan) and the summary."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    summary = train(trainer)
    return {
        "losses": trainer.losses,
        "pieces": pieces_of(trainer.detached_model()),
        "plan": describe_plan(trainer.plan),
        "summary": summary,
    }


def preprocess_then_train(cfg: Config, tsv: str, table_rows: int) -> dict:
    """Rank 0 preprocesses `tsv` into cfg.data.criteo.dir (ids modulo `table_rows`), as
    `python -m dlrm.data.criteo.preprocess --table-sizes N` does; then every rank: train_and_report."""
    if World.from_env().rank == 0:
        from dlrm.data.criteo.format import NUM_SPARSE, ParseOptions
        from dlrm.data.criteo.preprocess import preprocess

        assert cfg.data.criteo.dir is not None
        preprocess([tsv], cfg.data.criteo.dir, ParseOptions("fail", "modulo", (table_rows,) * NUM_SPARSE))
    torch.distributed.barrier(group=default_group())
    return train_and_report(cfg)


def write_parquet_then_train(cfg: Config) -> dict:
    """Rank 0 writes the dataset of tests/helpers/parquet_data.py into cfg.data.parquet.path; then every
    rank: train_and_report."""
    if World.from_env().rank == 0:
        from tests.helpers.parquet_data import write_dataset

        assert cfg.data.parquet.path is not None
        write_dataset(cfg.data.parquet.path)
    torch.distributed.barrier(group=default_group())
    return train_and_report(cfg)


def train_summary(cfg: Config) -> dict:
    """Train (or evaluate, with trainer.eval_only) on this rank and return the run summary."""
    from dlrm.trainer.loop import train

    return train(build_trainer(cfg))


def summary_and_records(cfg: Config, run_dir) -> dict:
    """Train (or evaluate) on this rank in `run_dir` (rank 0 writes there): {"summary", "records"}
    with rank 0's metrics.jsonl records ([] on other ranks)."""
    from dlrm.trainer.build import build
    from dlrm.trainer.loop import train

    validate(cfg)
    world = World.from_env()
    validate_world(cfg, world.world_size, world.local_world_size)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    summary = train(build(cfg, world, Path(run_dir)))
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if world.is_main else []
    return {"summary": summary, "records": [json.loads(line) for line in lines]}


def train_losses(cfg: Config) -> list[float]:
    """Train on this rank; the logged losses."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    train(trainer)
    return trainer.losses


def hierarchical_vs_flat(nodes: int, ranks_per_node: int) -> float:
    """Max |hierarchical - flat| over a few rank-dependent tensors (sizes not divisible by g too)."""
    from dlrm.distributed.dense_sync import hierarchical_allreduce_
    from dlrm.distributed.topology import build_process_groups

    default_group()
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    rank = torch.distributed.get_rank()
    worst = 0.0
    for n in (1, 7, 1000, 4099):
        t = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + n))
        flat = t.clone()
        torch.distributed.all_reduce(flat)
        flat /= torch.distributed.get_world_size()
        worst = max(worst, (hierarchical_allreduce_(t, groups) - flat).abs().max().item())
    return worst


def process_group_layout(nodes: int, ranks_per_node: int) -> dict:
    """The global ranks in this rank's intra-node and inter-node groups."""
    from dlrm.distributed.topology import build_process_groups

    default_group()
    groups = build_process_groups(torch.device("cpu"), nodes, ranks_per_node)
    layout = {
        "intra_node": torch.distributed.get_process_group_ranks(groups.intra_node),
        "inter_node": torch.distributed.get_process_group_ranks(groups.inter_node),
    }
    return layout


class _NaNInjector:
    """A batch source whose global batch `index` has a NaN dense feature in rank `rank`'s slice."""

    def __init__(self, source, index: int, rank: int) -> None:
        self.source, self.index, self.rank = source, index, rank

    def num_batches(self, split):
        return self.source.num_batches(split)

    def batches(self, split, rank, world_size, start_step=0):
        for step, batch in enumerate(self.source.batches(split, rank, world_size, start_step), start_step):
            if split == "train" and step == self.index and rank == self.rank:
                batch.dense_features[0, 0] = float("nan")
            yield batch


def train_with_a_nan_batch(cfg: Config, index: int, rank: int) -> dict:
    """train_and_report, with a NaN injected into one rank's slice of global batch `index`."""
    from dlrm.trainer.loop import train

    trainer = build_trainer(cfg)
    trainer.source = _NaNInjector(trainer.source, index, rank)
    train(trainer)
    return {"losses": trainer.losses, "pieces": pieces_of(trainer.model), "skipped": trainer.skipped_steps}


def resume_error(cfg: Config) -> str:
    """Build a trainer that resumes (cfg.trainer.resume) and return the CheckpointError it raises."""
    from dlrm.checkpoint import CheckpointError
    from dlrm.trainer.build import build

    validate(cfg)
    try:
        build(cfg, World.from_env())
    except CheckpointError as e:
        return str(e)
    raise AssertionError("the checkpoint was loaded")


def train_under_host_tensor_guard(cfg: Config) -> dict:
    """train_summary inside a HostTensorGuard (tests/helpers/nccl_guard.py): the collectives of ours
    that a GPU run would fail on (a host-made tensor), and how many collectives of ours were checked."""
    from tests.helpers.nccl_guard import HostTensorGuard

    with HostTensorGuard() as guard:
        summary = train_summary(cfg)
    return {"violations": guard.violations, "checked": guard.checked, "steps": summary["steps"]}


def collective_failures_of_a_stalled_rank(timeout_s: float) -> str | None:
    """Rank 1 stalls past `timeout_s` before an all-reduce of a group with that timeout: each rank's
    exception, as dlrm.train reports it (dlrm.distributed.topology.collective_failure), or None if unrecognised.
    Both ranks meet again on the default group afterwards (the family's next job)."""
    import time
    from datetime import timedelta

    from dlrm.distributed.topology import collective_failure

    default_group()
    group = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    rank = World.from_env().rank
    if rank == 1:
        time.sleep(3 * timeout_s)
    try:
        torch.distributed.all_reduce(torch.ones(4), group=group)
        line = "no failure"
    except RuntimeError as e:
        failure = collective_failure(e, timeout_s)
        line = None if failure is None else f"{failure.prefix}: {failure}"
    torch.distributed.barrier(group=default_group())
    return line


def ranges_ending_after_the_profiler_stops(steps: int) -> int:
    """`steps` DDP steps on Gloo, each profiled as the trainer profiles one (StepProfiler._profiled):
    how many profiler ranges ended after the profiler began to stop (a thread still recording then)."""
    import time

    from torch.profiler import profile

    import dlrm.trainer.profiler as profiler
    from dlrm.config import TrainerConfig
    from dlrm.trainer.phases import STEP_RANGE

    group = default_group()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def one_step() -> None:
        with torch.profiler.record_function(STEP_RANGE):  # the range the breakdown splits
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()

    stops: list[int] = []
    spans: list = []
    stop, read = profile.stop, profiler.spans_of
    profile.stop = lambda self: (stops.append(time.time_ns()), stop(self))[1]  # type: ignore[method-assign]
    profiler.spans_of = lambda prof: spans.append(read(prof)) or spans[-1]  # type: ignore[assignment]
    try:
        steps_profiler = profiler.StepProfiler(
            TrainerConfig(log_every_steps=1), torch.device("cpu"), group, torch.distributed.get_world_size(group), None
        )
        for _ in range(steps):
            with steps_profiler._profiled():
                one_step()
    finally:
        profile.stop, profiler.spans_of = stop, read  # type: ignore[method-assign]
    return sum(1 for at, step in zip(stops, spans, strict=True) for s in step if s.end * 1e9 > at)


def checkpoint_shares(root: str) -> dict:
    """Save a small checkpoint with the Checkpointer (each rank its own tensors, rank 0 the step), load
    it, then load damaged copies (a byte flipped, verified; a file removed, not verified) of a file in
    rank 1's share. Returns the names of the files this rank hashed while saving (`file_digest`) and
    checked while loading the intact one (`check_file`), whether it loaded, and the damaged loads' errors."""
    import shutil

    import torch.distributed as dist

    from dlrm.checkpoint import Checkpointer, CheckpointError, checkpointer, safe_load, step_tensor

    pg, rank = default_group(), dist.get_rank()
    hashed, checked = [], []
    real_digest, real_check = checkpointer.file_digest, safe_load.check_file
    checkpointer.file_digest = lambda file: hashed.append(file.name) or real_digest(file)  # rank 0: .metadata.tmp too
    safe_load.check_file = lambda path, name, *a, **k: checked.append(name) or real_check(path, name, *a, **k)

    def state(value: float) -> dict:
        return {
            "model": {f"rank{rank}.t{i}": torch.full((64, 4), value + i) for i in range(3)},
            "progress": {"step": step_tensor(1 if value else 0)},
        }

    def load_error(path: Path, verify: bool) -> str | None:
        try:
            safe_load.load_checkpoint(path, state(0.0), verify, pg)
        except CheckpointError as e:
            return str(e)
        return None

    try:
        saved = Checkpointer(Path(root), 2, pg, rank == 0).save(1, state(1.0), {})
        checked.clear()
        loaded = state(0.0)
        safe_load.load_checkpoint(saved, loaded, True, pg)
        same = all(torch.equal(a, b) for a, b in zip(loaded["model"].values(), state(1.0)["model"].values()))
        result = {"hashed": list(hashed), "checked": list(checked), "loaded": same}
        shares = sorted(p.name for p in saved.glob("*.distcp"))[1::2]  # rank 1's, as open_checkpoint splits them
        corrupt, missing = Path(root) / "corrupt", Path(root) / "missing"
        if rank == 0:
            shutil.copytree(saved, corrupt)
            shutil.copytree(saved, missing)
            data = bytearray((corrupt / shares[0]).read_bytes())
            data[len(data) // 2] ^= 0xFF
            (corrupt / shares[0]).write_bytes(bytes(data))
            (missing / shares[0]).unlink()
        dist.barrier()
        result.update(damaged=shares[0], corrupt=load_error(corrupt, True), missing=load_error(missing, False))
        return result
    finally:
        checkpointer.file_digest, safe_load.check_file = real_digest, real_check
