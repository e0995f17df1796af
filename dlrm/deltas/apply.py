"""Applying a chain of deltas to an export: the export at the last delta's step."""

from __future__ import annotations

from pathlib import Path

import torch

from dlrm.common.errors import UserError
from dlrm.deltas.publish import FORMAT as DELTA_FORMAT
from dlrm.deltas.publish import delta_sha256, read_manifest
from dlrm.export import FORMAT, VERSION, content_sha256


def _load(path: Path, what: str) -> dict:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as e:
        raise UserError(f"{path} is not a readable {what} ({str(e).splitlines()[0]}); give another file") from None
    if not isinstance(payload, dict):
        raise UserError(f"{path} is not a {what}")
    return payload


def chain(root: Path, base_step: int, to_step: int | None = None) -> list[dict]:
    """The manifest entries of `root` that lead from `base_step` (each one's base_step the previous one's
    step) to `to_step` (None: as far as the deltas go).

    Raises:
        UserError: `to_step` cannot be reached.
    """
    by_base = {e["base_step"]: e for e in read_manifest(root)}
    out, at = [], base_step
    while at in by_base and (to_step is None or by_base[at]["step"] <= to_step):
        out.append(by_base[at])
        at = by_base[at]["step"]
    if to_step is not None and at != to_step:
        raise UserError(
            f"the deltas in {root} lead from step {base_step} to step {at}, not {to_step}: give an export at a step a "
            "delta starts from (python -m dlrm.deltas list shows them), or another --to"
        )
    return out


def apply_chain(export: Path, root: Path, to_step: int | None = None) -> dict:
    """An export with a chain of deltas applied.

    Args:
        export: an exported model file.
        root: the deltas directory.
        to_step: the step to stop at; None: as far as the deltas go.

    Returns:
        The export's payload with the deltas from its step applied in order: every table's changed rows
        and the dense weights replaced, "step" and "sha256" updated.

    Raises:
        UserError: the export or a delta is damaged or of another format, or `to_step` cannot be reached.
    """
    payload = _load(export, "export")
    if payload.get("format") != FORMAT or payload.get("version") != VERSION:
        raise UserError(f"{export} is not a version {VERSION} {FORMAT} file; export the checkpoint again")
    if payload.get("sha256") != content_sha256(payload):
        raise UserError(f"{export}: its content does not match its sha256 (damaged); export the checkpoint again")
    state = payload["state_dict"]
    for entry in chain(root, int(payload["step"]), to_step):
        path = root / entry["file"]
        delta = _load(path, "delta")
        if delta.get("format") != DELTA_FORMAT or delta.get("sha256") != delta_sha256(delta):
            raise UserError(f"{path} is not an intact delta (format or sha256); publish it again")
        for key, part in delta["tables"].items():
            state[key][part["ids"]] = part["rows"]
        for key, value in delta["dense"].items():
            state[key] = value
        payload["step"] = int(delta["step"])
    payload["sha256"] = content_sha256(payload)
    return payload
