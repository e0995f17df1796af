"""The serving bundle (`--format bundle [--int8]`): a directory a server loads without this package.

The bundle is a new directory OUT holding
    model.pt2   the serving module captured by `torch.export` with a dynamic batch dimension and
                compiled by AOTInductor into a model package: load it with
                `torch._inductor.aoti_load_package` in Python or `torch::inductor::AOTIModelPackageLoader`
                in C++, no Python model code needed
    spec.json   the feature spec: how rows become the program's inputs
It is built in a temporary directory beside OUT, checked (the compiled program's probabilities on
probe batches equal the eager model's), then renamed to OUT in one step; an existing OUT is refused.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dlrm.common.errors import UserError
from dlrm.common.io import publish_dir, refuse_alias
from dlrm.config import ModelConfig, ParquetConfig
from dlrm.data.progress import Step
from dlrm.export.file import data_of, model_config_of, read_checkpoint
from dlrm.export.serving import ServingModel, feature_names, hooks_of
from dlrm.export.spec import PROGRAM_FILE, SPEC_FILE, build_spec
from dlrm.models.dlrm import build_model

MIN_TORCH = (2, 6)  # torch.export's public dynamic shapes and AOTInductor model packages (.pt2)
MAX_BATCH = 1 << 20  # the largest batch the compiled program takes
PROBE_BATCH = 5  # rows of the probe batch (above 1: torch.export specialises sizes 0 and 1)
PROBE_TOLERANCE = 1e-5  # compiled vs eager probabilities (fp32; AOTInductor fuses the MLPs differently)


def torch_problem(version: str | None = None) -> str | None:
    """Why this torch cannot write bundles (None: it can)."""
    version = version or torch.__version__
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return f"torch {version} is not a release version"
    if (major, minor) < MIN_TORCH or not hasattr(torch._inductor, "aoti_compile_and_package"):
        return f"torch {version} is too old for AOTInductor model packages (needs {'.'.join(map(str, MIN_TORCH))}+)"
    return None


def probe_inputs(
    cfg: ModelConfig, batch: int = PROBE_BATCH, seed: int = 0, dense_inputs: int | None = None
) -> tuple[torch.Tensor, ...]:
    """A batch of B = `batch` valid program inputs, in `input_names` order.

    dense [B, dense_inputs] float32 (default model.dense_in_features), then per feature values int64
    [N_f] of 0..3 ids per row within its table, lengths int64 [B] (and weights float32 [N_f]).
    """
    g = torch.Generator().manual_seed(seed)
    rows = {f: int(t.rows) for t in cfg.tables for f in t.features}
    width = cfg.dense_in_features if dense_inputs is None else dense_inputs
    inputs: list[torch.Tensor] = [torch.randn(batch, width, generator=g)]
    for f in feature_names(cfg):
        lengths = torch.randint(0, 4, (batch,), generator=g)
        lengths[0] = 2  # some ids in the batch, whatever the draw
        n = int(lengths.sum())
        inputs += [torch.randint(0, rows[f], (n,), generator=g), lengths]
        if cfg.weighted:
            inputs.append(torch.rand(n, generator=g))
    return tuple(inputs)


def dynamic_shapes(cfg: ModelConfig) -> dict[str, Any]:
    """torch.export's dynamic_shapes of forward(dense, *sparse): one batch dimension, a size per
    feature's values."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    sparse: list[Any] = []
    for i, _ in enumerate(feature_names(cfg)):
        ids = torch.export.Dim(f"ids_{i}", min=0, max=MAX_BATCH * 1024)
        sparse += [{0: ids}, {0: batch}] + ([{0: ids}] if cfg.weighted else [])
    return {"dense": {0: batch}, "sparse": tuple(sparse)}


def serving_model(
    cfg: ModelConfig, state: dict, int8: bool = False, parquet: ParquetConfig | None = None
) -> ServingModel:
    """The eval-mode serving module of the model `cfg` with weights `state` (an export's state dict),
    trained on `parquet`'s columns (their dense transforms run in the program)."""
    model = build_model(cfg)
    model.load_state_dict(state, assign=True)
    return ServingModel(model.model, cfg, hooks_of(model.model, cfg, parquet), int8=int8).eval()


def export_program(module: ServingModel, cfg: ModelConfig, what: str) -> torch.export.ExportedProgram:
    """`torch.export` of the serving module with a dynamic batch; UserError naming `what` when it cannot."""
    try:
        with torch.no_grad(), _quiet():
            inputs = probe_inputs(cfg, dense_inputs=module.dense_inputs)
            return torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes(cfg), strict=False)
    except Exception as e:  # torch.export raises many kinds (unsupported op, guard, data-dependent branch)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise UserError(
            f"cannot bundle {what}: torch.export cannot capture its serving module ({type(e).__name__}: {reason}); "
            "export it with --format file and score it with python -m dlrm.predict"
        ) from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No log records and no stderr while torch.export traces: on a failure it prints the partial graph
    there, which the one-line refusal replaces."""
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)


def compile_package(program: torch.export.ExportedProgram, path: Path) -> None:
    """AOTInductor: the exported program compiled into a model package at `path` (.pt2)."""
    torch._inductor.aoti_compile_and_package(program, package_path=str(path))


def load_package(path: Path) -> Any:
    """A compiled bundle program, callable on the flat list of input tensors (AOTInductor's loader)."""
    return torch._inductor.aoti_load_package(str(path))


def check_out(out: Path, checkpoint: Path) -> None:
    """Refuse an OUT that exists or whose directory does not, before any work."""
    refuse_alias(out, "the output", {"the checkpoint": checkpoint})
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} already exists; choose a new path for the bundle (it is never overwritten)")
    if not out.parent.is_dir():
        raise UserError(f"cannot write {out}: its directory does not exist; give a path in an existing directory")


def bundle(checkpoint: Path, out: Path, int8: bool = False, verify: bool = True) -> dict:
    """Write the bundle of the checkpoint's model to the new directory `out`.

    Args:
        checkpoint: a checkpoint directory.
        out: the bundle directory to create; it must not exist, its parent must.
        int8: store the tables row-wise int8.
        verify: check the checkpoint's data files' sha256 before loading.

    Returns:
        The bundle's feature spec, as written to spec.json.

    Raises:
        UserError: this torch cannot write bundles, `out` exists or cannot be written, the model
            cannot be exported, or the compiled program disagrees with the eager model.
    """
    problem = torch_problem()
    if problem:
        raise UserError(f"{problem}; install the pinned torch (launch/setup.sh) to write a bundle")
    check_out(out, checkpoint)
    cfg = model_config_of(checkpoint)
    payload = read_checkpoint(checkpoint, verify)
    data = data_of(checkpoint, payload["data"], cfg)
    module = serving_model(cfg, payload["state_dict"], int8, data.parquet)
    program = export_program(module, cfg, f"the model of {checkpoint}")
    spec = build_spec(cfg, data, payload["data"], payload["step"], payload["sha256"], int8)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp", dir=out.parent))
    try:
        with Step("export", "compiling the program (AOTInductor: a minute or more)"):
            compile_package(program, work / PROGRAM_FILE)
        (work / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        with Step("export", "checking the compiled program against the eager model"):
            _check_compiled(work / PROGRAM_FILE, module, cfg)
        os.chmod(work, 0o755)
        _publish_dir(work, out)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}; free space or choose another path") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return spec


def _check_compiled(package: Path, module: ServingModel, cfg: ModelConfig) -> None:
    """The compiled program's probabilities on two probe batches equal the eager module's."""
    runner = load_package(package)
    for batch, seed in ((PROBE_BATCH, 1), (1, 2)):
        inputs = probe_inputs(cfg, batch, seed, module.dense_inputs)
        with torch.no_grad():
            want = module(*inputs)
        got = runner(*inputs)
        got = got[0] if isinstance(got, list | tuple) else got
        if got.shape != want.shape or not torch.allclose(got, want, rtol=0, atol=PROBE_TOLERANCE):
            raise UserError(
                f"the compiled program of {package.parent} differs from the eager model on a probe batch "
                f"(max |diff| {float((got - want).abs().max()):.3g}); report it with the torch version"
            )


def _publish_dir(work: Path, out: Path) -> None:
    """Rename the finished directory `work` to `out` (the same filesystem) in one step, files flushed first."""
    if out.exists():  # appeared while compiling
        raise UserError(f"{out} already exists; choose a new path for the bundle (it is never overwritten)")
    publish_dir(work, out)
