"""How big each step is: steps, batches and time limits (full on a GPU, quick on CPU), and the MLPerf
DCNv2 tables capped to what the card holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# What a first GPU user needs first: training that runs (and checkpoints), its speed at the MLPerf shape,
# the precision options, tables in host memory behind a cache through an evaluation, save -> resume ->
# eval-only on another plan, then tables as large as the card holds, which take the longest.
ORDER = (
    "train",
    "throughput",
    "fp16",
    "bf16_qcomms",
    "bf16_tables",
    "bf16_probe",
    "uvm_caching",
    "resume",
    "eval_only_reshard",
    "full_tables",
)
TABLE_SHARE = 0.6  # of the card's memory for the full tables and their row-wise Adagrad state
THROUGHPUT_TABLE_ROWS = 2_000_000  # the throughput step's cap: bench_dcnv2's advice for one GPU
QUICK_TABLE_ROWS = 1000  # --quick: every MLPerf DCNv2 table capped at this many rows
MLPERF_PER_GPU = 1.72e6  # samples/s per H100 in MLPerf Training v4.0 DLRM-DCNv2 (8 GPUs, NVIDIA's result)


@dataclass
class Sizes:
    """Steps, batches and time limits of one check: full (a GPU) or quick (CPU, or a smoke test)."""

    batch: int  # train, fp16, bf16_qcomms, resume, eval_only_reshard
    steps: int
    resume_steps: int
    log_every: int
    eval_every: int
    ckpt_every: int
    eval_batches: int
    gpu_batch: int  # throughput, uvm_caching, full_tables: one GPU's share of bench_dcnv2's 65,536
    warmup: int  # throughput: untimed steps, then windows x window timed ones
    windows: int
    window: int
    uvm_steps: int  # an evaluation halfway
    full_steps: int
    timeout_s: dict[str, int] = field(default_factory=dict)
    min_start_s: int = 20  # a step is not started with less budget left than this


FULL = Sizes(
    batch=4096, steps=200, resume_steps=300, log_every=50, eval_every=100, ckpt_every=100, eval_batches=8,
    gpu_batch=8192, warmup=20, windows=5, window=20, uvm_steps=60, full_steps=30,
    # in ORDER; together within the default --budget-s (480): none is starved by another's overrun
    timeout_s={"train": 60, "throughput": 70, "fp16": 40, "bf16_qcomms": 35, "bf16_tables": 15, "bf16_probe": 25,
               "uvm_caching": 60, "resume": 40, "eval_only_reshard": 30, "full_tables": 105},
    min_start_s=25,
)  # fmt: skip
QUICK = Sizes(
    batch=128, steps=8, resume_steps=12, log_every=2, eval_every=4, ckpt_every=4, eval_batches=2,
    gpu_batch=256, warmup=2, windows=2, window=2, uvm_steps=8, full_steps=4,
    timeout_s=dict.fromkeys(ORDER, 150),
)  # fmt: skip


def table_rows(model: str = "mlperf_dcnv2") -> list[tuple[int, int]]:
    """(rows, dim) of each table of conf/model/<model>.yaml, in order."""
    cfg = yaml.safe_load((ROOT / "conf" / "model" / f"{model}.yaml").read_text())
    return [(int(t["rows"]), int(t["dim"])) for t in cfg["tables"]]


def table_bytes(tables: list[tuple[int, int]]) -> int:
    """fp32 weights and row-wise Adagrad's one fp32 state per row."""
    return sum(rows * (4 * dim + 4) for rows, dim in tables)


def row_cap(tables: list[tuple[int, int]], budget_bytes: float) -> int | None:
    """The largest common row cap C with every table at min(rows, C) within `budget_bytes`
    (`table_bytes`); None when the tables fit whole."""
    if table_bytes(tables) <= budget_bytes:
        return None
    low, high = 1, max(rows for rows, _ in tables)
    while low < high:  # the largest C that fits
        mid = (low + high + 1) // 2
        if table_bytes([(min(r, mid), d) for r, d in tables]) <= budget_bytes:
            low = mid
        else:
            high = mid - 1
    return low


def cap_overrides(tables: list[tuple[int, int]], cap: int | None) -> list[str]:
    """Hydra overrides capping each table at `cap` rows (model.tables.I.rows=N, as dlrm.bench.training
    --max-table-rows caps them); [] for no cap."""
    return [f"model.tables.{i}.rows={cap}" for i, (rows, _) in enumerate(tables) if cap is not None and rows > cap]


def card_tables(card_mib: int, share: float = TABLE_SHARE) -> tuple[float, int | None]:
    """For a card of `card_mib` MiB: its memory in GB (topology.hbm_GB: what the planner and the memory check
    must see) and the MLPerf DCNv2 tables' row cap that keeps them within `share` of it."""
    card = card_mib * 2**20
    return card / 1e9, row_cap(table_rows(), share * card)
