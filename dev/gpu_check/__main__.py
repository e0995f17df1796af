"""The GPU acceptance check: what a first GPU user needs, on one borrowed GPU within a time budget.

    python dev/gpu_check [--out DIR] [--work DIR] [--logs DIR] [--budget-s N] [--device cuda|cpu] [--quick]

Each step is one process (`python -m dlrm.train`, or a probe of dev/gpu_check/probes.py that times the
Trainer's own steps) on one rank (`topology=dgx_h100 topology.ranks_per_node=1` with topology.hbm_GB the
card's memory on cuda, `topology=cpu` on cpu), with its own time limit; none starts once --budget-s
seconds are spent. In order (dev/gpu_check/sizing.py ORDER):

  train              the default model, breakdown off: log steps, evaluations on the device, checkpoints
  throughput         bench_dcnv2 (MLPerf DCNv2) at one GPU's batch of 8,192, breakdown off: samples/s of
                     the host clock, each step's device time from CUDA events, peak GPU memory
  fp16               fp16 tables and fp16 comms both ways; bf16_qcomms: bf16 comms (cuda only)
  bf16_tables        model.embedding_precision=bf16 refused in one line; bf16_probe (cuda): whether this
                     fbgemm trains bf16 weights at all
  uvm_caching        (cuda) tables in host memory behind a 5% HBM cache with the prefetch pipeline, an
                     evaluation halfway: the cache's hit rate before and after it, no line left locked
  resume             train's run continued to more steps (trainer.resume=auto)
  eval_only_reshard  train's last checkpoint evaluated resharded row-wise: train's AUC and log loss
  full_tables        the MLPerf DCNv2 tables capped to 60% of the card's memory (whole if they fit)

The report (<out>/report.json, rewritten atomically after every step) names the card (nvidia-smi), the
versions against CI's pins (pyproject.toml, launch/setup.sh), the commit, then per step the command,
exit code, wall seconds, figures, passed and the reason; what this machine cannot run under
not_available; the verdict. Each step's console is in <logs>/<step>.log (default <out>), run directories
and the probes' JSON under --work (default <out>/runs). --device cpu implies --quick (tiny steps, batches
and tables: the dry run tests/dev/test_gpu_check.py makes). Exit status 0 when every step that ran
passed, else 1.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # dev.gpu_check and dlrm from this checkout (a bundle's source has no install)

from dev.gpu_check.check import Check  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python dev/gpu_check",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, default=Path("outputs/gpu_check"), help="report.json and the step logs")
    p.add_argument("--work", type=Path, default=None, help="the runs' directories (default <out>/runs)")
    p.add_argument("--logs", type=Path, default=None, help="each step's console, <step>.log (default <out>)")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no step after this many seconds")
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if nvidia-smi is found")
    p.add_argument("--quick", action="store_true", help="tiny steps, batches and tables (implied by --device cpu)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs each step")
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if shutil.which("nvidia-smi") else "cpu"
    if args.device == "cpu":
        args.quick = True
    if not args.budget_s > 0:
        p.error("--budget-s must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return Check(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
