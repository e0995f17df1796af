"""Training metrics: AUC and log loss, throughput, peak memory, metrics.jsonl and summary.json."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import binary_auroc
from tqdm import tqdm


def auc_and_logloss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """ROC AUC and mean binary log loss of logits [N] against 0/1 labels [N]."""
    labels = labels.float()
    auc = binary_auroc(torch.sigmoid(logits.float()), labels.long()).item()
    logloss = F.binary_cross_entropy_with_logits(logits.float(), labels).item()
    return auc, logloss


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class MetricsLog:
    """Appends one JSON object per line to `metrics.jsonl` (rank 0 only; others pass path=None)."""

    def __init__(self, path: Optional[Path]) -> None:
        self._file = open(path, "a", buffering=1) if path is not None else None

    def write(self, **record) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record, sort_keys=True) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Progress:
    """A progress bar on an interactive terminal, plain log lines otherwise; silent off rank 0.

    mode: auto (bar if stderr is a terminal), bar, lines, none.
    """

    def __init__(self, total: int, mode: str, enabled: bool) -> None:
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "lines"
        self.mode = mode if enabled else "none"
        self.total = total
        self._bar = tqdm(total=total, unit="step", dynamic_ncols=True) if self.mode == "bar" else None

    def update(self, step: int, steps_done: int, **figures) -> None:
        """Report `figures` (loss, lr, samples_per_s, ...) at `step` after `steps_done` new steps."""
        text = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
        if self._bar is not None:
            self._bar.update(steps_done)
            self._bar.set_postfix_str(text)
        elif self.mode == "lines":
            print(f"step {step}/{self.total} {text}", flush=True)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        elif self.mode != "none":
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
