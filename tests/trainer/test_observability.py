"""What a run shows and records: a clean console, train.log, metrics.jsonl, TensorBoard scalars,
and a per-phase step breakdown that adds up to the step's measured time."""

import json
import math
import re
import subprocess
import sys

import pytest

from dlrm.trainer.phases import PHASES, phase_of
from tests.helpers import REPO_ROOT as REPO

STEPS, EVERY, SAMPLED = 12, 4, 2  # profiled: the last step of windows 2 (step 8) and 3 (the run's last)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One single-process training run of the default model: (CompletedProcess, run dir)."""
    run_dir = tmp_path_factory.mktemp("run")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrm.train",
            f"trainer.max_steps={STEPS}",
            f"trainer.log_every_steps={EVERY}",
            f"trainer.breakdown_every={SAMPLED}",
            "data.eval_batches=2",
            "trainer.progress=lines",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run_dir


def test_console_has_no_library_noise(short_run):
    result, run_dir = short_run
    out, err = result.stdout, result.stderr
    for noise in (
        "INFO",
        "[TBE=",
        "AMD FP16",
        "TopologyFactory",
        "dense_tensor_estimate",
        "is_fx_tracing",
        "USDT",
        "FutureWarning",
        "warning",
    ):
        assert noise not in out and noise not in err, noise
    lines = out.splitlines()
    assert len(lines) <= 20, out  # config (4), plan (2), 3 step lines, eval, 4 closing lines, done
    assert any(line.startswith(f"step {STEPS}/{STEPS} loss ") and "eta 0:00" in line for line in lines), out
    assert any(line.startswith("step breakdown, ms") for line in lines), out


def test_train_log_holds_step_and_eval_lines(short_run):
    _, run_dir = short_run
    text = (run_dir / "train.log").read_text()
    assert f"step {EVERY}/{STEPS} loss" in text and f"step {STEPS}/{STEPS} loss" in text
    assert f"eval at step {STEPS}: auc" in text
    assert "[TBE=" not in text  # fbgemm's INFO lines stay out of the file too


def test_metrics_jsonl_records_time(short_run):
    _, run_dir = short_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(EVERY, STEPS + 1, EVERY))
    assert [(r["event"], r["step"], r["resumed"]) for r in records if "event" in r] == [("start", 0, False)]
    assert "event" in records[0]  # the invocation's first record
    elapsed = [r["elapsed_s"] for r in records]
    assert elapsed == sorted(elapsed) and all(r["time"] > 1.7e9 for r in records)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["job_wall_time_s"] > summary["wall_time_s"] > 0


def test_tensorboard_holds_the_scalars(short_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir = short_run
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    wanted = {"train/loss", "train/lr", "train/samples_per_s", "train/peak_rss_mb", "eval/auc", "eval/logloss"}
    wanted |= {f"phase_s/{p}" for p in PHASES}
    assert wanted <= tags, wanted - tags
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(EVERY, STEPS + 1, EVERY))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(losses, rel=1e-6)


def test_phases_add_up_to_the_step_time(short_run):
    _, run_dir = short_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "phase_s" in r]
    assert [r["step"] for r in windows] == [EVERY * SAMPLED, STEPS]  # every SAMPLED-th window, and the last
    for r in windows:
        phases = r["phase_s"]
        assert set(phases) == set(PHASES) and all(v >= 0 for v in phases.values())
        # the profiler's events, phase by phase, against the loop's own clock around the same step
        assert sum(phases.values()) == pytest.approx(r["profiled_step_s"], rel=0.10)
        named = sum(v for k, v in phases.items() if k != "other")
        assert named > 0.5 * r["profiled_step_s"], phases  # the named ranges explain most of the step
        assert phases["dense_fwd"] > 0 and phases["backward"] > 0 and phases["emb_lookup"] > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step_breakdown"]["profiled_steps"] == 2
    assert summary["comm_vs_model"]["embedding_exchange"]["ratio"] is None  # one rank: nothing modelled


@pytest.mark.parametrize(
    "name, phase",
    [
        ("## next_batch ##", "data"),
        ("## copy_batch_to_gpu 12 ##", "data"),
        ("## wait_sparse_data_dist 3 ##", "input_dist"),
        ("## all2all_data:kjt lengths ##", "input_dist"),
        ("[lookup]_[model.sparse_arch.embedding_bag_collection]_[table_wise]", "emb_lookup"),
        ("[output_dist_wait]_[model.sparse_arch.embedding_bag_collection]_[table_wise]", "emb_a2a_fwd"),
        ("autograd::engine::evaluate_function: All2All_Pooled_ReqBackward", "grad_a2a"),
        ("## All2All_Pooled_bwd ##", "grad_a2a"),
        ("## forward 7 ##", "dense_fwd"),
        ("## backward 7 ##", "backward"),
        ("Optimizer.step#CombinedOptimizer.step", "optimizer"),
        ("aten::mm", None),
        ("## Request wait() ##", None),
    ],
)
def test_phase_of_names(name, phase):
    assert phase_of(name) == phase


def test_breakdown_of_a_profiled_toy_step():
    """Nested ranges: each instant counts once, for the innermost range with a phase."""
    import torch
    from torch.profiler import profile, record_function

    from dlrm.trainer.phases import STEP_RANGE, kineto_quiet, spans_of, step_breakdown

    x = torch.randn(256, 256, requires_grad=True)
    prof = profile()
    with kineto_quiet():
        prof.start()
    with record_function(STEP_RANGE):
        with record_function("## forward ##"):
            with record_function("[lookup]_[toy]"):
                y = x @ x
            loss = (y @ y).sum()
        with record_function("## backward ##"):
            loss.backward()
    with kineto_quiet():
        prof.stop()
    spans = spans_of(prof)
    ((phases, comm),) = step_breakdown(spans)
    step = next(s.end - s.start for s in spans if s.name == STEP_RANGE)
    assert sum(phases.values()) == pytest.approx(step, rel=1e-6)
    assert phases["emb_lookup"] > 0 and phases["dense_fwd"] > 0 and phases["backward"] > 0
    assert comm == {} and not math.isnan(sum(phases.values()))


def test_device_breakdown_follows_the_launching_op():
    """Hand-made spans (seconds): each kernel counts for the phase of the CPU event that launched it
    (linked by correlation id), even when it runs after the step's CPU side. Events of another thread
    (the autograd engine's, on CUDA) take the phase the step's thread is in when they start, unless
    their own name has one. Kernels launched outside the step, or by nothing, count for no step."""
    from dlrm.trainer.phases import PHASES, STEP_RANGE, Span, device_breakdown

    def cpu(name, a, b, correlation=0, thread=1):
        return Span(name, thread, a, b, correlation=correlation)

    def kernel(a, b, linked):
        return Span("kernel", 7, a, b, device=True, linked=linked)

    spans = [
        cpu(STEP_RANGE, 0, 10),
        cpu("## forward ##", 0, 4),
        cpu("[lookup]_[t]", 1, 2),
        cpu("aten::index_select", 1.2, 1.5, correlation=11),
        cpu("aten::mm", 2.5, 3.5, correlation=12),
        cpu("## backward ##", 4, 9),
        cpu("cudaLaunchKernel", 4.1, 4.2, correlation=13),
        cpu("aten::mm", 20, 21, correlation=14),  # outside the step
        cpu("autograd::engine::evaluate_function: MmBackward0", 4.5, 5.5, thread=2),
        cpu("aten::mm", 4.6, 5.4, correlation=15, thread=2),
        cpu("autograd::engine::evaluate_function: All2All_Pooled_ReqBackward", 6, 7, thread=2),
        cpu("nccl:all_to_all", 6.1, 6.2, correlation=16, thread=2),
        cpu("aten::mm", 30, 31, correlation=17, thread=2),  # outside the step
        kernel(1.4, 2.4, linked=11),
        kernel(3.0, 3.25, linked=12),
        kernel(9.5, 12.0, linked=13),  # runs past the step's CPU side
        kernel(20.5, 21.0, linked=14),
        kernel(5.0, 5.5, linked=15),
        kernel(6.2, 6.4, linked=16),
        kernel(30.5, 31.0, linked=17),
        kernel(5, 6, linked=0),
    ]
    (phases,) = device_breakdown(spans)
    expected = dict.fromkeys(PHASES, 0.0) | {"emb_lookup": 1.0, "dense_fwd": 0.25, "backward": 3.0, "grad_a2a": 0.2}
    assert phases == pytest.approx(expected)


def test_fitted_topology_recovers_the_bench_links(make_config):
    """A bench whose times follow alpha + factor * n / B exactly gives back alpha and B."""
    from dlrm.comms.costmodel import Link, collective_time
    from dlrm.comms.measured import fitted_topology

    topology = make_config("topology=cpu").topology
    true = Link(topology.intra_node.fabric, 30e-6, 2e9)
    rows = [
        {
            "collective": c,
            "scope": "world",
            "group_size": 2,
            "bytes": n,
            "median_us": collective_time(c, true, 2, n) * 1e6,
        }
        for c in ("alltoall", "allreduce")
        for n in (2**10, 2**16, 2**20, 2**24)
    ]
    for collective in ("alltoall", "allreduce"):
        fitted = fitted_topology(topology, {"results": rows}, collective, 2)
        assert fitted.intra_node.latency_us == pytest.approx(30.0, rel=1e-6)
        assert fitted.intra_node.bandwidth_GBps == pytest.approx(2.0, rel=1e-6)
        assert fitted.inter_node == topology.inter_node
        assert not fitted.intra_node.placeholder  # measured now


def test_placeholder_figures_are_not_compared(make_config):
    """Links marked as placeholders (cpu_2x2's; here cpu's intra-node link marked so): the measured
    communication is not put beside a model built on them (compared False, why naming the link and the
    fix); measured figures (topology=cpu's fitted intra-node link) are."""
    from dlrm.comms.measured import comm_vs_model

    measured, waits = {"alltoall": 4e-3, "allreduce": 3e-3}, {"alltoall": 1e-3, "allreduce": 0.0}
    critical = {"alltoall": 3.5e-3, "allreduce": 3.2e-3}  # all in to all out: a rank may leave early
    args = ([], 2, 2, 10_000, None, measured, waits, None, critical)  # no tables: the dense allreduce alone
    placeholder = comm_vs_model(make_config("topology=cpu", "topology.intra_node.placeholder=true"), *args)
    for kind in ("embedding_exchange", "dense_allreduce"):
        row = placeholder[kind]
        assert not row["compared"] and row["ratio"] is None, row
        assert "topology cpu's intra_node figures are placeholders" in row["why"] and "dlrm.comms.fit" in row["why"]
    measured_links = comm_vs_model(make_config("topology=cpu"), *args)
    row = measured_links["dense_allreduce"]
    assert row["compared"] and row["ratio"] == pytest.approx(3.2e-3 / row["model_s"])
    assert row["transfer_s"] == pytest.approx(3e-3) and row["measured_s"] == pytest.approx(3.2e-3)
    unmeasured = comm_vs_model(make_config("topology=cpu"), *args[:-1])  # a breakdown without comm_critical_s
    assert (
        not unmeasured["dense_allreduce"]["compared"]
        and "last entry to last exit" in unmeasured["dense_allreduce"]["why"]
    )
    assert measured_links["embedding_exchange"]["why"] == "the model sends nothing for this plan"


def test_fitted_topology_needs_the_collective_at_this_size(make_config):
    from dlrm.comms.costmodel import CommsError
    from dlrm.comms.measured import fitted_topology

    rows = [
        {"collective": "allreduce", "scope": "world", "group_size": 4, "bytes": n, "median_us": 10.0 + n / 1e3}
        for n in (1024, 4096)
    ]
    with pytest.raises(CommsError, match="no alltoall times at two sizes among 2 ranks"):
        fitted_topology(make_config().topology, {"results": rows}, "alltoall", 2)


def test_breakdown_nesting_and_exposed_allreduce():
    """Hand-made spans (seconds): innermost phase wins, ops inherit their range's phase, and the
    backward range's idle time under a running allreduce counts as dense_allreduce."""
    from dlrm.trainer.phases import STEP_RANGE, Span, step_breakdown

    def span(name, a, b, thread=1):
        return Span(name, thread, a, b)

    spans = [
        span(STEP_RANGE, 0, 10),
        span("## forward ##", 0, 4),
        span("[lookup]_[t]", 1, 2),
        span("aten::mm", 2.5, 3.5),
        span("## backward ##", 4, 9),
        span("aten::mm", 4, 5),
        span("autograd::engine::evaluate_function: All2All_Pooled_ReqBackward", 5, 6),
        span("## optimizer ##", 9, 9.5),
        span("gloo:all_reduce", 6.5, 8.5, thread=2),
        span("gloo:all_to_all", 1.5, 2.5, thread=3),
        span("gloo:all_to_all", 1.8, 3.0, thread=2),
        span("aten::mm", 20, 21),  # outside the step
    ]
    ((phases, comm),) = step_breakdown(spans)
    expected = {
        "emb_lookup": 1,
        "dense_fwd": 3,
        "backward": 2,
        "grad_a2a": 1,
        "dense_allreduce": 2,
        "optimizer": 0.5,
        "other": 0.5,
        "data": 0,
        "input_dist": 0,
        "emb_a2a_fwd": 0,
    }
    assert phases == pytest.approx(expected)
    assert comm == pytest.approx({"allreduce": 2.0, "alltoall": 1.5})  # union of the two alltoall spans


def test_setup_logging_per_rank(tmp_path, capsys):
    """Rank 0: INFO of ours to console and train.log, the root logger's INFO (fbgemm's) nowhere,
    file-only records only in the file; another rank: warnings only, prefixed with its rank."""
    import logging

    from dlrm.run.logs import setup_logging
    from dlrm.trainer.progress import FILE_ONLY

    ours = logging.getLogger("dlrm.test")
    try:
        setup_logging(0, tmp_path)
        ours.info("hello from rank 0")
        ours.info("file only", extra=FILE_ONLY)
        logging.info("[TBE=x] library detail")  # the root logger, as fbgemm logs
        ours.warning("careful")
        out = capsys.readouterr().out
        assert "hello from rank 0" in out and "warning: careful" in out
        assert "file only" not in out and "TBE" not in out
        text = (tmp_path / "train.log").read_text()
        assert "hello from rank 0" in text and "file only" in text and "TBE" not in text

        setup_logging(1, None)
        ours.info("rank 1 info")
        ours.warning("rank 1 warning")
        captured = capsys.readouterr()
        assert "rank 1 info" not in captured.out + captured.err
        assert "[rank 1] WARNING dlrm.test: rank 1 warning" in captured.err
    finally:
        for handler in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(handler)
            handler.close()
        logging.captureWarnings(False)


@pytest.mark.parametrize("rank", [0, 1])
def test_known_library_notices_are_dropped_and_others_kept(tmp_path, capsys, rank):
    """TorchRec's per-table notices about data-parallel tables (no sharding spec, cache settings
    ignored) are not shown, on any rank; its other warnings are."""
    import logging

    from dlrm.run.logs import setup_logging

    try:
        setup_logging(rank, tmp_path if rank == 0 else None)
        logging.warning("Sharding spec not found for model.sparse_arch.embedding_bag_collection.t_C1")
        utils = logging.getLogger("torchrec.distributed.utils")
        utils.warning("Sharding Type is data_parallel, caching params will be ignored")
        utils.warning("Compute Kernel is dense, caching params will be ignored")
        utils.warning("something else about caching")
        logging.warning("another root warning")
        captured = capsys.readouterr()
        text = captured.out + captured.err + ((tmp_path / "train.log").read_text() if rank == 0 else "")
        assert "Sharding spec not found" not in text and "caching params will be ignored" not in text, text
        assert "something else about caching" in text and "another root warning" in text, text
    finally:
        for handler in list(logging.getLogger().handlers):
            logging.getLogger().removeHandler(handler)
            handler.close()
        logging.captureWarnings(False)


def test_dense_lookup_without_autograd_kernel_still_gets_exact_gradients():
    """torch warns that fbgemm's CPU lookup of data-parallel tables has no autograd kernel and that this
    "may lead to silently incorrect behavior"; dlrm.run.logs ignores that warning because the kernel
    records its own backward. This checks it: forward and weight gradients equal nn.EmbeddingBag's.
    If fbgemm or torch changes so that the warning means what it says, this fails."""
    import warnings

    import torch
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import DenseTableBatchedEmbeddingBagsCodegen

    from dlrm.run.logs import DENSE_LOOKUP_WARNING

    torch.manual_seed(0)
    lookup = DenseTableBatchedEmbeddingBagsCodegen([(10, 4), (7, 8)], use_cpu=True)
    weights = lookup.weights.detach().clone()
    ids, offsets = torch.tensor([1, 2, 3, 9, 0, 6, 6]), torch.tensor([0, 2, 4, 4, 7])  # 2 tables x 2 bags
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = lookup(ids, offsets)  # [2 bags, 4 + 8]
        grad_out = torch.randn_like(out)
        (out * grad_out).sum().backward()
    assert any(re.search(DENSE_LOOKUP_WARNING, str(w.message)) for w in seen), "the warning is gone: drop the filter"
    start = 0
    for t, (rows, dim) in enumerate([(10, 4), (7, 8)]):
        bag = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        bag.weight.data = weights[start : start + rows * dim].view(rows, dim).clone()
        cols = slice(0, 4) if t == 0 else slice(4, 12)
        expected = bag(ids[offsets[2 * t] : offsets[2 * t + 2]], offsets[2 * t : 2 * t + 2] - offsets[2 * t])
        torch.testing.assert_close(out[:, cols], expected)
        (expected * grad_out[:, cols]).sum().backward()
        got = lookup.weights.grad[start : start + rows * dim].view(rows, dim)
        torch.testing.assert_close(got, bag.weight.grad)
        start += rows * dim


@pytest.mark.parametrize("available, expected", [(None, 1600), (6, 6), (2000, 1600), (0, 0)])  # of 1600
def test_console_names_the_eval_batches_that_run(available, expected):
    """The config line says how many eval batches an evaluation scores: data.eval_batches, or the eval
    split's all when it holds fewer (a small Criteo file), never the 1600 asked for when 6 run."""
    from dlrm.config import Config
    from dlrm.trainer import console
    from dlrm.trainer.evaluator import eval_batch_count

    cfg = Config()
    cfg.data.eval_batches = 1600
    n = eval_batch_count(cfg.data.eval_batches, available)
    assert n == expected
    line = console.config_lines(cfg, 1, 2, "gloo", "cpu", 1000, 10, n)[1]
    assert f"eval {expected} batches" in line if expected else "no eval (the data has no eval split" in line
    assert ("data.eval_batches=1600" in line) == (expected < 1600), line


def test_the_console_says_one_reason_once():
    """comm_vs_model on the console: each row's ratio or reason, and a reason that holds for every row
    (placeholder figures) said once, without a model source that nothing was compared with."""
    from dlrm.trainer.console import comm_lines

    breakdown = {"comm_s": {}, "comm_wait_s": {}}
    why = "topology cpu's intra_node figures are placeholders"
    rows = {k: {"compared": False, "ratio": None, "why": why} for k in ("embedding_exchange", "dense_allreduce")}
    (line,) = [x for x in comm_lines(breakdown, {**rows, "model": "topology config"}) if "measured vs model" in x]
    assert line == f"comms per step, measured vs model: not compared ({why})"
    rows["dense_allreduce"] = {"compared": True, "ratio": 2.0, "measured_s": 2e-3, "model_s": 1e-3}
    (line,) = [x for x in comm_lines(breakdown, {**rows, "model": "topology config"}) if "measured vs model" in x]
    tail = "dense_allreduce 2.00 vs 1.00 ms (x2.00) (model: topology config)"
    assert line.endswith(f"embedding_exchange not compared ({why}); {tail}"), line
