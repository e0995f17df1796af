"""Serving latency on the CPU: a compiled bundle against the eager model, and int8 tables' accuracy.

    python -m dlrm.bench.serving --out serving.json [--threads 1] [--large-rows 250000] [--int8]
    python -m dlrm.bench.serving --int8-auc RUN_DIR [--eval-batches 20]

Latency: two models with seeded initial weights, conf/model/dlrm_small.yaml and the same network
with `--large-rows` rows per table. For each, the bundle's size and load time, then, interleaved per
batch size (1, 64 and 1,024 one-hot rows of uniform ids), p50 and p99 latency of the compiled
program and of the eager network under `torch.inference_mode`, and rows/s at 1,024. `--int8` adds
the large model with row-wise int8 tables. `--threads` sets torch's intra-op threads for both.

`--int8-auc`: AUC and log loss of a training run's last checkpoint on its eval batches, scored by
the serving module with fp32 and with int8 tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm.config import Config, ModelConfig
from dlrm.data.source import make_source
from dlrm.export.bundle import compile_package, export_program, load_package, serving_model
from dlrm.export.file import model_config_of, read_checkpoint
from dlrm.export.serving import ServingModel, feature_names
from dlrm.models.dlrm import build_model, initialize
from dlrm.trainer.metrics import auc_and_logloss

REPO = Path(__file__).resolve().parents[2]
BATCHES = (1, 64, 1024)
CALLS = {1: 300, 64: 100, 1024: 30}  # calls timed per batch size and round


def model_config(rows: int | None) -> ModelConfig:
    """dlrm_small, its tables resized to `rows` rows when given."""
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "conf/model/dlrm_small.yaml"))
    if rows is not None:
        for t in cfg.tables:
            t.rows = rows
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def one_hot_inputs(cfg: ModelConfig, batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Program inputs of `batch` rows: dense N(0, 1), one uniform id per feature."""
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(batch, cfg.dense_in_features, generator=g)]
    for t in cfg.tables:
        for _ in t.features:
            inputs += [torch.randint(0, t.rows, (batch,), generator=g), torch.ones(batch, dtype=torch.int64)]
    return tuple(inputs)


def eager_call(net: torch.nn.Module, cfg: ModelConfig) -> Callable[..., torch.Tensor]:
    """The eager network over the program's inputs: their KeyedJaggedTensor, the logits, their sigmoid."""
    names = feature_names(cfg)

    def call(dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        kjt = KeyedJaggedTensor(keys=names, values=torch.cat(sparse[0::2]), lengths=torch.cat(sparse[1::2]))
        return torch.sigmoid(net(dense, kjt))

    return call


def latencies(call: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], calls: int) -> list[float]:
    """Seconds of each of `calls` calls (after 3 untimed ones)."""
    out = []
    with torch.inference_mode():
        for _ in range(3):
            call(*inputs)
        for _ in range(calls):
            t0 = time.perf_counter()
            call(*inputs)
            out.append(time.perf_counter() - t0)
    return out


def bench_model(name: str, cfg: ModelConfig, work: Path, int8: bool, rounds: int) -> dict:
    """Size, compile and load time, and latencies of one model's bundle against its eager network.

    Args:
        name: the model's label in the results.
        int8: bundle with row-wise int8 tables (the eager network is then not timed).
        rounds: interleaved rounds of calls per batch size.

    Returns:
        The figures as a flat dict: bundle_mib, compile_s, load_s, and per program and batch size b
        `{program}_b{b}_p50_ms` and `_p99_ms`, and `{program}_rows_per_s_b1024`.
    """
    model = build_model(cfg, torch.device("cpu"))
    initialize(model, cfg, seed=0)
    net = model.model.eval()
    result: dict = {"model": name, "params": sum(p.numel() for p in model.parameters()), "int8": int8}
    serving = ServingModel(net, cfg, int8=int8).eval()
    t0 = time.perf_counter()
    program = export_program(serving, cfg, name)
    package = work / f"{name}.pt2"
    compile_package(program, package)
    result["compile_s"] = time.perf_counter() - t0
    result["bundle_mib"] = package.stat().st_size / 2**20
    t0 = time.perf_counter()
    runner = load_package(package)
    result["load_s"] = time.perf_counter() - t0
    calls = {"bundle": runner, **({} if int8 else {"eager": eager_call(net, cfg)})}
    timings: dict[str, dict[int, list[float]]] = {k: {b: [] for b in BATCHES} for k in calls}
    for r in range(rounds):  # interleaved: both see the same machine load
        for b in BATCHES:
            inputs = one_hot_inputs(cfg, b, seed=r)
            for kind, call in calls.items():
                timings[kind][b] += latencies(call, inputs, CALLS[b])
    for kind, per_batch in timings.items():
        for b, seconds in per_batch.items():
            ms = np.array(seconds) * 1e3
            result[f"{kind}_b{b}_p50_ms"] = float(np.percentile(ms, 50))
            result[f"{kind}_b{b}_p99_ms"] = float(np.percentile(ms, 99))
        result[f"{kind}_rows_per_s_b1024"] = 1024 / statistics.fmean(per_batch[1024])
    return result


def int8_auc(run: Path, eval_batches: int) -> dict:
    """AUC and log loss of the run's last checkpoint on `eval_batches` of its eval split, fp32 and int8 tables."""
    checkpoint = sorted((run / "checkpoints").glob("step_*"))[-1]
    merged = OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(run / ".hydra" / "config.yaml"))
    cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    model_cfg = model_config_of(checkpoint)
    state = read_checkpoint(checkpoint)["state_dict"]
    modules = {name: serving_model(model_cfg, state, name == "int8") for name in ("fp32", "int8")}
    source = make_source(cfg)
    scores: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
    labels = []
    with torch.inference_mode():
        for _, batch in zip(range(eval_batches), source.batches("eval", 0, 1), strict=False):
            kjt = batch.sparse_features.to_dict()
            inputs = [batch.dense_features]
            for f in feature_names(model_cfg):
                inputs += [kjt[f].values().long(), kjt[f].lengths().long()]
            for name, module in modules.items():
                scores[name].append(module(*inputs))
            labels.append(batch.labels.float())
    result: dict = {"checkpoint": str(checkpoint), "rows": int(sum(len(y) for y in labels))}
    for name, parts in scores.items():
        auc, logloss = auc_and_logloss(torch.logit(torch.cat(parts).double()), torch.cat(labels))
        result[f"{name}_auc"], result[f"{name}_logloss"] = auc, logloss
    return result


def table(results: list[dict]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| model | program | size MiB | load s | p50/p99 ms b=1 | b=64 | b=1024 | rows/s b=1024 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        kinds = ["bundle"] + (["eager"] if "eager_b1_p50_ms" in r else [])
        for kind in kinds:
            label = f"bundle{' int8' if r['int8'] else ''}" if kind == "bundle" else "eager"
            size = f"{r['bundle_mib']:.1f}" if kind == "bundle" else ""
            load = f"{r['load_s']:.2f}" if kind == "bundle" else ""
            cells = [f"{r[f'{kind}_b{b}_p50_ms']:.3f} / {r[f'{kind}_b{b}_p99_ms']:.3f}" for b in BATCHES]
            rate = f"{r[f'{kind}_rows_per_s_b1024']:,.0f}"
            lines.append(f"| {r['model']} | {label} | {size} | {load} | {' | '.join(cells)} | {rate} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--large-rows", type=int, default=250_000, help="rows of each table of the large model")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of timed calls")
    ap.add_argument("--int8", action="store_true", help="also the large model with row-wise int8 tables")
    ap.add_argument("--int8-auc", type=Path, default=None, help="a training run's directory: int8 vs fp32 AUC")
    ap.add_argument("--eval-batches", type=int, default=20, help="--int8-auc: eval batches scored")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.int8_auc is not None:
        print(json.dumps(int8_auc(a.int8_auc, a.eval_batches)))
        return
    models = [("main_job", model_config(None), False), (f"large_{a.large_rows}", model_config(a.large_rows), False)]
    if a.int8:
        models.append((f"large_{a.large_rows}", model_config(a.large_rows), True))
    results = []
    with tempfile.TemporaryDirectory() as work:
        for name, cfg, int8 in models:
            results.append(bench_model(name, cfg, Path(work), int8, a.rounds))
            print(json.dumps(results[-1]), flush=True)
    print(f"threads {a.threads}\n{table(results)}")
    if a.out is not None:
        a.out.write_text(json.dumps({"threads": a.threads, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
