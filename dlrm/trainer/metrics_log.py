"""The run's time series: metrics.jsonl and TensorBoard, written on rank 0."""

from __future__ import annotations

import json
import time
from pathlib import Path

from dlrm.common.io import disk_full_is_user_error


class MetricsLog:
    """The run's time series, on rank 0 (other ranks pass path=None and tensorboard_dir=None).

    `metrics.jsonl`: one JSON object per `write`, with `time` (Unix seconds) and `elapsed_s` (since
    this log was opened) added. TensorBoard (`tensorboard_dir`): every number of a record as a
    scalar at its step, under `<group>/<key>` (group: "train", "eval", "phase_s", "comm_s", ...).
    """

    def __init__(self, path: Path | None, tensorboard_dir: Path | None = None) -> None:
        self._file = open(path, "a", buffering=1) if path is not None else None
        self._tb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when used

            self._tb = SummaryWriter(str(tensorboard_dir))
        self._start = time.monotonic()

    def write(self, group: str = "train", **record) -> None:
        """Record `record` (it must hold `step`) under `group` (TensorBoard's tag prefix)."""
        if self._file is not None:
            stamped = dict(record, time=round(time.time(), 3), elapsed_s=round(time.monotonic() - self._start, 3))
            with disk_full_is_user_error(self._file.name, "metrics"):
                self._file.write(json.dumps(stamped, sort_keys=True) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, dict):
                    for sub, v in value.items():
                        if isinstance(v, (int, float)) and v is not None:
                            self._tb.add_scalar(f"{key}/{sub}", v, record["step"])
                elif key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    tag = key[len(group) + 1 :] if key.startswith(f"{group}_") else key
                    self._tb.add_scalar(f"{group}/{tag}", value, record["step"])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
