"""Hostile command lines for dlrm.train and the launchers: every user error ends in exactly one
`error:` line that names the key or value and the fix, exit status 2, and no traceback.

Most cases run `dlrm.train.main` in-process (sys.argv patched, no torchrun variables: one process);
a few run the real commands (python -m dlrm.train, launch/run_cpu.sh under torchrun) to check what a
user sees on the console, including torchrun's part.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from dlrm import train
from dlrm.common import errors
from dlrm.common.errors import UserError
from dlrm.config import ConfigError
from tests.helpers import REPO_ROOT as ROOT
from tests.helpers.cli import TORCHRUN_VARS, assert_one_error, main_in_process, record_sleeps, train_in_process

# (overrides, words the one error line must hold: the key or value, and the fix)
CASES = {
    "misspelt key": (
        ["trainer.max_step=50"],
        ["unknown config key 'trainer.max_step'", "did you mean 'trainer.max_steps'?"],
    ),
    "misspelt section": (["trainr.max_steps=5"], ["'trainr.max_steps'", "did you mean 'trainer.max_steps'?"]),
    "misspelt nested key": (
        ["topology.intra_node.bandwith_GBps=3"],
        ["did you mean 'topology.intra_node.bandwidth_GBps'?"],
    ),
    "misspelt key added with +": (["+trainer.max_stepz=1"], ["did you mean 'trainer.max_steps'?"]),
    "unknown key, nothing close": (
        ["trainer.colour=red"],
        ["'trainer.colour'", "the keys under 'trainer' are", "max_steps"],
    ),
    "unknown group option": (
        ["model=dlrm_smal"],
        ["unknown option 'dlrm_smal' for config group 'model'", "did you mean 'dlrm_small'?"],
    ),
    "unknown optimizer option": (["optim=lamb"], ["'lamb'", "config group 'optim'", "rowwise_adagrad"]),
    "wrong type": (["trainer.max_steps=many"], ["'trainer.max_steps'", "'many'", "Integer"]),
    "override without =": (["trainer.max_steps"], ["'trainer.max_steps'", "key=value"]),
    "new dict entry without +": (
        ["sharding.per_table.t_C1=row_wise"],
        ["'sharding.per_table.t_C1'", "'+sharding.per_table.t_C1=VALUE'"],
    ),
    "nan embedding lr": (["optim.embedding.lr=nan"], ["'optim.embedding.lr' = nan", "positive, finite"]),
    "inf dense lr": (["optim.dense.lr=inf"], ["'optim.dense.lr' = inf", "positive, finite"]),
    "negative lr": (["optim.embedding.lr=-0.1"], ["'optim.embedding.lr' = -0.1", "positive"]),
    "nan eps": (["optim.dense.eps=nan"], ["'optim.dense.eps' = nan"]),
    "infinite memory": (["topology.ddr_GB=inf"], ["'topology.ddr_GB' = inf", "finite"]),
    "dim fbgemm cannot use": (
        ["model=tiny", "model.tables.0.dim=6"],
        ["'model.tables[0].dim' = 6", "multiple of 4", "use 8"],
    ),
    "dot over tables of different dims": (
        ["model=tiny", "model.tables.1.dim=4"],
        ["'model.tables[*].dim' = [4, 8]", "same dim", "model.interaction=dcn"],
    ),
    "more tasks than logits": (
        ["model=tiny", "model.tasks=[{name:click},{name:like}]"],
        ["'model.top_mlp' = [16, 1]", "one logit per task", "use [16, 2]"],
    ),
    "task name unfit for a metric key": (
        ["model=tiny", "model.tasks=[{name:'a b'}]"],
        ["'model.tasks[0].name' = 'a b'", "letters, digits"],
    ),
    "several tasks on criteo": (
        ["model=tiny", "model.tasks=[{name:click},{name:like}]", "model.top_mlp=[16,2]", "data.source=criteo"],
        ["'model.tasks' = ['click', 'like']", "one label column"],
    ),
    "mean pooling split by rows": (
        ["model=tiny", "model.tables.3.pooling_type=mean", "sharding=row_wise"],
        ["'model.tables[3].pooling_type' = 'mean'", "t_C4 is sharded row_wise", "+sharding.per_table.t_C4=table_wise"],
    ),
    "adam on cpu": (
        ["optim=adam"],
        ["'optim.embedding.name' = 'adam'", "optim=rowwise_adagrad", "sharding=data_parallel"],
    ),
    "unknown sharding": (["sharding.strategy=diagonal"], ["'sharding.strategy' = 'diagonal'", "row_wise"]),
    "zero batch": (["data.global_batch_size=0"], ["'data.global_batch_size' = 0"]),
    "nan latency": (["topology.inter_node.latency_us=nan"], ["'topology.inter_node.latency_us' = nan", ">= 0"]),
    "typo beside --cfg": (["--cfg", "job", "trainer.max_step=3"], ["'trainer.max_step'", "did you mean"]),
    "typo beside --cfg=job --resolve": (["--cfg=job", "--resolve", "model=dlrm_smal"], ["'dlrm_smal'"]),
    "multirun": (["-m", "trainer.max_steps=1,2"], ["-m/--multirun", "one command per setting"]),
    "hydra changing directory": (["hydra.job.chdir=true"], ["hydra.job.chdir=true", "relative paths", "false"]),
    "rerun from a pickle": (["--experimental-rerun", "x/config.pickle"], ["--experimental-rerun", "can run code"]),
    "uvm on cpu": (["sharding.compute_kernel=fused_uvm_caching"], ["'sharding.compute_kernel'", "host memory already"]),
    "cache factor 0": (["sharding.cache_load_factor=0"], ["'sharding.cache_load_factor' = 0", "(0, 1]"]),
    "cache factor without cache": (
        ["sharding.compute_kernel=fused", "sharding.cache_load_factor=0.1"],
        ["'sharding.cache_load_factor'", "has no cache"],
    ),
    "prefetch on cpu": (["sharding.prefetch_pipeline=true"], ["'sharding.prefetch_pipeline'", "GPU topologies only"]),
    "prefetch without pipeline": (
        ["topology=dgx_h100", "sharding.prefetch_pipeline=true", "trainer.pipeline=false"],
        ["'sharding.prefetch_pipeline'", "trainer.pipeline=true"],
    ),
    "bad run.name after a good one": (["run.name=a", "run.name=a/b"], ["'run.name' = 'a/b'", "letters, digits"]),
    "unknown flag": (["--colour", "model=tiny"], ["unrecognized arguments: --colour", "--help"]),
    "cfg of another kind": (["--cfg", "everything"], ["--cfg", "'everything'", "--help"]),
    "config path": (["-cp", "elsewhere"], ["-cp/--config-path elsewhere", "-cd DIR"]),
    "missing config dir": (["-cd", "/nonexistent/conf"], ["/nonexistent/conf (-cd/--config-dir) not found"]),
    "config dir and searchpath": (
        ["-cd", str(ROOT / "conf"), "hydra.searchpath=[pkg://x]"],
        ["either -cd/--config-dir or hydra.searchpath"],
    ),
    "unknown package for --cfg": (["--cfg", "job", "--package", "trainr"], ["--package trainr", "no such key"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_command_line_is_one_error_line(monkeypatch, capsys, case):
    args, words = CASES[case]
    code, out, err = main_in_process(monkeypatch, capsys, *args, "hydra.run.dir=/nonexistent/never-made")
    assert_one_error(code, out, err, *words)
    assert not Path("/nonexistent/never-made").exists()  # refused before Hydra made a run directory


@pytest.mark.parametrize(
    "args, run_dir",
    [
        (["run.name='quoted'"], "outputs/quoted"),
        (['run.name="dq"'], "outputs/dq"),
        (["run.name=a", "run.name=b"], "outputs/b"),  # the last one wins, as in Hydra
        (["++run.name=forced"], "outputs/forced"),
        (["run.name=n", "hydra.run.dir='elsewhere'"], "elsewhere"),  # hydra.run.dir wins
    ],
)
def test_named_run_directory_is_the_name_hydra_reads(monkeypatch, capsys, args, run_dir):
    """A named run's directory comes from the value Hydra composes (quotes, repeats, ++)."""
    seen = []
    monkeypatch.setattr(train, "start", lambda composed, cfg, world: seen.append(composed.hydra.run.dir))
    monkeypatch.setattr(sys, "argv", ["dlrm.train", *args])
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    train.main()
    assert seen == [run_dir]


def test_cfg_prints_the_config_the_run_would_use(monkeypatch, capsys):
    """--cfg job|hydra prints the config composed and placed as a run would be (a named run's directory
    included), the overrides before or after the flags, and trains nothing."""
    monkeypatch.setattr(train, "start", lambda *a: pytest.fail("--cfg must not run the job"))
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["dlrm.train", "run.name=n", "--cfg", "hydra", "--resolve", "model=tiny"])
    train.main()
    out = capsys.readouterr().out
    assert "hydra:" in out and "dir: outputs/n" in out and "model: tiny" in out, out
    monkeypatch.setattr(sys, "argv", ["dlrm.train", "--cfg=job", "--package", "trainer", "trainer.max_steps=7"])
    train.main()
    out = capsys.readouterr().out
    assert out.startswith("# @package trainer\n") and "max_steps: 7" in out, out


def _user_config_dir(tmp_path: Path) -> Path:
    """A user's config directory for -cd: conf/model/tiny.yaml with a wider bottom MLP, as model=mine."""
    (tmp_path / "myconf" / "model").mkdir(parents=True)
    tiny = (ROOT / "conf" / "model" / "tiny.yaml").read_text()
    assert "bottom_mlp: [16, 8]" in tiny
    (tmp_path / "myconf" / "model" / "mine.yaml").write_text(tiny.replace("bottom_mlp: [16, 8]", "bottom_mlp: [32, 8]"))
    return tmp_path / "myconf"


def test_config_dir_adds_groups_and_is_checked_like_conf(monkeypatch, capsys, tmp_path):
    """-cd DIR (Hydra's --config-dir) composes DIR's options with conf/'s before anything starts: a
    typo gets the "did you mean" among both, a bad value is refused before a run directory exists,
    and a good command runs the job on DIR's option."""
    conf = _user_config_dir(tmp_path)
    run_dir = tmp_path / "run"
    code, out, err = main_in_process(monkeypatch, capsys, "-cd", str(conf), "model=mne", f"hydra.run.dir={run_dir}")
    assert_one_error(code, out, err, "'mne'", "did you mean 'mine'?", f"{conf}/model/")
    args = ("-cd", str(conf), "model=mine", "trainer.max_steps=-1", f"hydra.run.dir={run_dir}")
    code, out, err = main_in_process(monkeypatch, capsys, *args)
    assert_one_error(code, out, err, "'trainer.max_steps' = -1")
    assert not run_dir.exists()  # refused before Hydra made a run directory
    seen = []
    monkeypatch.setattr(train, "start", lambda composed, cfg, world: seen.append(cfg.model.bottom_mlp))
    monkeypatch.setattr(sys, "argv", ["dlrm.train", "model=mine", "-cd", str(conf), f"hydra.run.dir={run_dir}"])
    train.main()
    assert seen == [[32, 8]]


def test_hydra_parser_reads_what_dlrm_train_relies_on():
    """dlrm.train reads its command line with Hydra's own (private) parser: the flags' names and
    overrides mixed with flags, as this Hydra version parses them."""
    args = train.command_line(["a=1", "-cd", "d", "--cfg", "job", "b=2", "-cn", "c", "--resolve", "--package", "p"])
    assert (args.overrides, args.config_dir, args.config_name, args.cfg) == (["a=1", "b=2"], "d", "c", "job")
    assert args.resolve and args.package == "p" and not (args.help or args.hydra_help or args.shell_completion)
    assert args.info is None and args.multirun is False and args.experimental_rerun is None


def test_a_run_writes_hydra_records(monkeypatch, capsys, tmp_path):
    """The config composed once runs as `@hydra.main` would run it (run_job, with Hydra's internal
    `Callbacks`): HydraConfig names the run directory, `.hydra/` holds the config and the overrides,
    config.yaml is written; the training itself is replaced here."""
    seen = []

    def fake_run(cfg, run_dir, world):
        from hydra.core.hydra_config import HydraConfig

        seen.append((cfg.trainer.max_steps, run_dir, HydraConfig.get().runtime.output_dir))
        return {"steps": 3, "train_samples_per_s": 1.0, "eval_auc": None, "eval_logloss": None}

    monkeypatch.setattr(train, "run", fake_run)
    run_dir = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["dlrm.train", "model=tiny", "trainer.max_steps=3", f"hydra.run.dir={run_dir}"])
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    train.main()
    assert seen == [(3, run_dir, str(run_dir))]
    assert f"outputs in {run_dir}" in capsys.readouterr().out
    assert "max_steps: 3" in (run_dir / ".hydra" / "config.yaml").read_text()
    assert "trainer.max_steps=3" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "max_steps: 3" in (run_dir / "config.yaml").read_text()


def test_topology_against_the_launcher_is_checked_before_torchrun_store(monkeypatch, capsys):
    """2 ranks of a 2 x 2 topology: refused by every rank before any store or process group, printed by rank 0."""
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    code, out, err = main_in_process(monkeypatch, capsys, "topology=cpu_2x2", env=env)
    assert_one_error(code, out, err, "topology.nodes", "WORLD_SIZE=2", "--nnodes=2")
    # Rank 1 meets the same error: it waits for rank 0 to report it and torchrun to stop the job;
    # if that does not happen (here: no torchrun), it reports it itself, with its rank.
    waits = record_sleeps(monkeypatch)
    code, out, err = main_in_process(monkeypatch, capsys, "topology=cpu_2x2", env=dict(env, RANK="1", LOCAL_RANK="1"))
    assert waits == [errors.REPORT_GRACE_S]
    assert_one_error(code, out, err, "error: [rank 1] config key 'topology.nodes'")


def test_model_that_cannot_fit_is_refused_before_any_process_group(monkeypatch, capsys, tmp_path):
    """MLPerf DCNv2 (98 GB of tables) on one 8 GB CPU rank: a PlanError naming GB, ranks and the fix."""
    code, out, err = main_in_process(monkeypatch, capsys, "model=mlperf_dcnv2", f"hydra.run.dir={tmp_path}")
    assert_one_error(code, out, err, "8.00 GB (topology.ddr_GB)", "at least 14 such ranks", "topology.nodes=")
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_planner_refusal_is_a_plan_error_naming_tables_and_fix():
    """TorchRec's PlannerError (a plan that passes the memory lower bound, yet finds no plan)
    becomes a PlanError: capacity, the largest tables, the fix and TorchRec's reason, one line."""
    from torchrec.distributed.planner.types import PlannerError

    from dlrm.config.compose import compose
    from dlrm.distributed.capacity import PlanError, planner_refusal

    cfg = compose(["model=mlperf_dcnv2", "topology=dgx_h100", "topology.hbm_GB=1"])
    e = planner_refusal(
        cfg,
        8,
        PlannerError(
            "Unable to find a plan for this model because of insufficient storage.\nPlanner evaluated 136 proposals."
        ),
    )
    assert isinstance(e, PlanError) and isinstance(e, UserError) and e.same_on_all_ranks
    text = str(e)
    assert "\n" not in text
    for word in (
        "8 ranks with 1.00 GB each (topology.hbm_GB)",
        "26 tables",
        "largest: t_C",
        "topology.nodes=2",
        "insufficient storage",
    ):
        assert word in text, text


def test_user_error_wrapped_by_dcp_is_unwrapped(capsys):
    """DCP wraps each rank's exception in a CheckpointException; the entry point finds ours inside."""
    from torch.distributed.checkpoint import CheckpointException

    inner = ConfigError("config key 'x' = 1 is invalid: use 2")
    wrapped = CheckpointException("load failed", {1: (inner, traceback.StackSummary())})
    try:
        raise RuntimeError("outer") from wrapped
    except RuntimeError as e:
        with pytest.raises(SystemExit) as exc:
            errors.exit_on_user_error(e, 0)
    out, err = capsys.readouterr()
    assert_one_error(exc.value.code, out, err, "config key 'x' = 1", "use 2")


def test_other_failures_keep_their_traceback(capsys):
    """A bug is not a user error: exit_on_user_error returns, so the caller re-raises it."""
    assert errors.exit_on_user_error(RuntimeError("bug"), 0) is None
    assert capsys.readouterr() == ("", "")


def test_rank_local_errors_are_printed_with_the_rank():
    class LocalError(UserError):
        pass

    assert errors.user_error_message(LocalError("file f is bad"), 1) == "error: [rank 1] file f is bad"
    assert errors.user_error_message(ConfigError("bad key"), 1) is None  # rank 0 says it
    assert errors.user_error_message(ConfigError("bad key"), 0) == "error: bad key"


@pytest.mark.parametrize("launcher", [True, False])
def test_rank_local_error_waits_for_rank_0_under_torchrun(monkeypatch, capsys, launcher):
    """An error of rank 1's own (a file it reads) that rank 0 meets too is said once: under torchrun,
    rank 1 waits before printing, and rank 0's exit stops it; alone, it prints at once."""

    class LocalError(UserError):
        pass

    waits = record_sleeps(monkeypatch)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if launcher:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(SystemExit) as exc:
        errors.exit_on_user_error(LocalError("shard 3 is bad"), 1)
    assert exc.value.code == 2
    assert waits == ([errors.LOCAL_GRACE_S] if launcher else [])
    assert capsys.readouterr().err == "error: [rank 1] shard 3 is bad\n"
    with pytest.raises(SystemExit):
        errors.exit_on_user_error(LocalError("shard 3 is bad"), 0)  # rank 0 never waits
    assert waits == ([errors.LOCAL_GRACE_S] if launcher else [])
    monkeypatch.setenv("LOCAL_RANK", "2")  # a node's third rank waits 2 s longer than its first
    with pytest.raises(SystemExit):
        errors.exit_on_user_error(LocalError("shard 3 is bad"), 3)
    assert waits[-1:] == ([errors.LOCAL_GRACE_S + 2] if launcher else [])


def test_quiet_torchrun_hides_only_user_errors():
    """dlrm.torchrun ends quietly only when the first failure exited 2 and the rest exited 2 or were stopped."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from dlrm.torchrun import only_user_errors

    def failure(rank, code, t):
        f = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="/nonexistent")
        f.timestamp = t
        return f

    assert only_user_errors({0: failure(0, 2, 1), 1: failure(1, -signal.SIGTERM, 2)}) == 2
    assert only_user_errors({0: failure(0, 2, 1), 1: failure(1, 2, 1)}) == 2
    assert only_user_errors({0: failure(0, 143, 1), 1: failure(1, 143, 1)}) == 143  # a clean stop on SIGTERM
    assert only_user_errors({0: failure(0, 130, 1), 1: failure(1, -signal.SIGTERM, 2)}) == 130
    assert only_user_errors({0: failure(0, 3, 1), 1: failure(1, 3, 1)}) == 3  # a collective timed out (one line)
    assert only_user_errors({0: failure(0, 1, 1), 1: failure(1, 2, 2)}) is None  # a crash came first
    assert only_user_errors({0: failure(0, 2, 1), 1: failure(1, -signal.SIGSEGV, 2)}) is None  # and a segfault
    assert only_user_errors({0: failure(0, -signal.SIGKILL, 1)}) is None  # e.g. the OOM killer
    assert only_user_errors({}) is None


# --- launchers (bash only: no Python starts) --------------------------------------------------------


def launcher(script, *args, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("NPROC", "NGPU", "TOPOLOGY", "TORCHRUN")}
    full.update(DRY_RUN="1", TORCHRUN="torchrun", DLRM_ACCEL="cpu", **env)
    r = subprocess.run(
        ["bash", str(ROOT / "launch" / script), *args], env=full, capture_output=True, text=True, timeout=60
    )
    return r


@pytest.mark.parametrize(
    "script,args,env,words",
    [
        (
            "run_cpu.sh",
            ["topology=cpu_2x2"],
            {"NPROC": "2"},
            ["topology 'cpu_2x2' has 2 nodes x 2 ranks", "NPROC=2", "run_multinode.sh", "topology.nodes=1"],
        ),
        (
            "run_cpu.sh",
            ["topology=cpu_2x2", "topology.nodes=1"],
            {"NPROC": "3"},
            ["NPROC=3", "2 ranks per node", "set NPROC=2", "topology.ranks_per_node=3"],
        ),
        ("run_cpu.sh", ["topology=dgx_h10"], {}, ["topology=dgx_h10", "dgx_h100"]),
        ("run_cpu.sh", [], {"NPROC": "0"}, ["NPROC=0 is below 1"]),
        ("run_node.sh", ["topology=dgx_h100"], {"NGPU": "4"}, ["NGPU=4", "8 ranks per node", "set NGPU=8"]),
    ],
)
def test_launcher_refuses_before_torchrun(script, args, env, words):
    r = launcher(script, *args, **env)
    assert_one_error(r.returncode, r.stdout, r.stderr, *words)
    assert "+ " not in r.stderr  # no command was run


# --- the real commands (a few: each pays Python's and torch's start) --------------------------------


def test_python_m_dlrm_train_typo():
    r = subprocess.run(
        [sys.executable, "-m", "dlrm.train", "trainer.max_step=50"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = assert_one_error(r.returncode, r.stdout, r.stderr)
    assert line == "error: unknown config key 'trainer.max_step'; did you mean 'trainer.max_steps'?"


def test_run_cpu_user_error_is_one_line_under_torchrun():
    """Two ranks under the launcher: rank 0 prints the error, rank 1 nothing, torchrun nothing."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TORCHRUN", "DRY_RUN")}
    r = subprocess.run(
        ["bash", "launch/run_cpu.sh", "optim.dense.lr=nan"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_error(r.returncode, r.stdout, r.stderr, "'optim.dense.lr' = nan")
    assert "failed (exitcode" not in r.stderr and "SIGTERM" not in r.stderr


def test_quiet_torchrun_still_reports_a_crash():
    """Not a user error (a child exits 1): torchrun's failure summary and status stay."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "dlrm.torchrun",
            "--nnodes=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "--nproc_per_node=1",
            "-m",
            "no_such_module_dlrm",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert "ChildFailedError" in r.stderr and "no_such_module_dlrm" in r.stderr


@pytest.mark.slow
def test_run_cpu_model_too_large_under_torchrun():
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "TORCHRUN", "DRY_RUN")}
    r = subprocess.run(
        ["bash", "launch/run_cpu.sh", "model=mlperf_dcnv2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_error(r.returncode, r.stdout, r.stderr, "topology.ddr_GB", "at least 14 such ranks")


def test_non_finite_loss_names_both_causes(capfd, tmp_path):
    """A loss gone non-finite while training (the process group up) is one error line naming both learning
    rates; run in the test process, which `process_state_kept` then restores."""
    code, out, err = train_in_process(
        capfd, "model=tiny", "optim=sgd", "optim.dense.lr=1e30", "optim.embedding.lr=1e30", "trainer.max_steps=6",
        "trainer.log_every_steps=1", "trainer.pipeline=false", f"hydra.run.dir={tmp_path}", cwd=ROOT,
    )  # fmt: skip
    assert_one_error(code, out, err, "loss is", "optim.dense.lr", "NaN/inf values")


def test_hydra_callbacks_get_the_primary_config_name(monkeypatch, tmp_path):
    """`-cn NAME` reaches Hydra's callbacks as the config's name, as `@hydra.main` passes it."""
    from hydra._internal.callbacks import Callbacks

    names = []
    for hook in ("on_run_start", "on_run_end"):
        original = getattr(Callbacks, hook)
        monkeypatch.setattr(
            Callbacks, hook, lambda self, *a, _o=original, **kw: names.append(kw["config_name"]) or _o(self, *a, **kw)
        )
    summary = {"steps": 1, "train_samples_per_s": 1.0, "eval_auc": None, "eval_logloss": None}
    monkeypatch.setattr(train, "run", lambda cfg, run_dir, world: summary)
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "mine.yaml").write_text("defaults:\n  - config\n  - _self_\n")
    argv = ["dlrm.train", "-cd", str(conf), "-cn", "mine", "model=tiny", f"hydra.run.dir={tmp_path / 'run'}"]
    monkeypatch.setattr(sys, "argv", argv)
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    train.main()
    assert names == ["mine", "mine"]


def test_user_error_inside_the_job_is_one_line(monkeypatch, capsys, tmp_path):
    """An error the job itself raises (bad data met while training) reaches the user as one line:
    Hydra's `run_job` records it as a failed job without printing a line of its own."""

    def fails(cfg, run_dir, world):
        raise UserError("data file x.parquet: column 'c' holds NaN; fix the file")

    monkeypatch.setattr(train, "run", fails)
    code, out, err = main_in_process(monkeypatch, capsys, "model=tiny", f"hydra.run.dir={tmp_path / 'run'}")
    assert_one_error(code, out, err, "x.parquet", "column 'c'")
