#!/usr/bin/env python3
"""A bundle for a bare GPU machine (no package registry, at most 64 MiB carried in per call): the wheels
its image lacks, this repository's source, in parts of at most --part-mib MiB with sha256 sums.

    python dev/gpu_bundle.py build [--out /tmp/gpu_bundle] [--part-mib 60] [--source head|worktree]
    python dev/gpu_bundle.py pack STAGING_DIR --out DIR [--part-mib N | --part-bytes N] [--src DIR]
    python dev/gpu_bundle.py carry K [K ...] | all [--out /tmp/gpu_bundle] [--to .gpu_bundle]

build:  downloads (pip download, Python 3.12 / manylinux x86_64) the wheels below into <out>/wheels (kept:
        a second build downloads nothing), builds the two that PyPI has as source only, rewrites every
        wheel with stored (uncompressed) zip members so that xz sees the raw bytes (the CUDA kernels in
        fbgemm-gpu repeat a lot: 2.5 GB of .so files shrink to about 150 MB) and packs them as below
        (13 CPU-minutes of xz -9; skipped when WHEELS.lock shows the same wheels and the parts are
        intact); then writes the source apart, small, as src.tar.xz (git archive of HEAD, or with
        --source worktree the working tree's tracked and untracked files: dlrm/ conf/ launch/
        pyproject.toml README.md, with BUNDLE_COMMIT), so a new commit needs no new parts.
pack:   STAGING_DIR -> <out>/bundle.tar.xz.partNN (xz -9), MANIFEST.sha256 (each part, sha256sum's
        format), bundle.tar.xz.sha256 (the whole archive) and install.sh (dev/gpu_install.sh). The parts
        are the archive's bytes cut in order: `cat bundle.tar.xz.part* > bundle.tar.xz`. With --src DIR,
        also src.tar.xz (DIR as src/) and src.tar.xz.sha256.
carry:  copies parts K... (or all of them) and the manifests into <to> inside the repository (git-ignored),
        the path a device call names in `carry` (dev/README.md).

The wheels: the GPU image has torch 2.11 (CUDA 13), Python 3.12, and already tqdm, pyre-extensions,
typing-inspect, numpy, PyYAML, packaging, cloudpickle, portalocker, lightning-utilities, matplotlib,
tensorboard (KINDS.md of the device notes). TorchRec 1.N pairs with torch 2.(N+5): torchrec 1.6.1 and
fbgemm-gpu 1.6.0 (PyPI's build is CUDA 13: it needs libcudart.so.13); torchrec's other needs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # dlrm from this checkout
from dlrm.common.io import sha256_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
ARCHIVE = "bundle.tar.xz"
MANIFEST = "MANIFEST.sha256"
SRC = "src.tar.xz"
LOCK = "WHEELS.lock"
# (requirement, how to get it): "binary" wheels for CPython 3.12 manylinux x86_64, "any" pure-Python
# wheels, "build": PyPI has only a source distribution, built here into a py3-none-any wheel.
WHEELS = [
    ("fbgemm-gpu==1.6.0", "binary"),
    ("torchrec==1.6.1", "any"),
    ("torchmetrics==1.0.3", "any"),  # torchrec 1.6.1 pins it (the image has 1.9.0)
    ("tensordict==0.15.3", "any"),  # torch>=2.11 in its metadata
    ("pyvers>=0.2,<0.3", "any"),  # tensordict's
    ("iopath==0.1.10", "build"),
    ("hydra-core>=1.3,<1.4", "any"),
    ("omegaconf>=2.2,<2.4", "any"),
    ("antlr4-python3-runtime==4.9.3", "build"),  # hydra-core / omegaconf pin 4.9.*
]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
SOURCE_PATHS = ["dlrm", "conf", "launch", "dev", "pyproject.toml", "README.md"]


def log(msg: str) -> None:
    print(f"[gpu_bundle] {msg}", flush=True)


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def wheel_name(req: str) -> str:
    """'hydra-core>=1.3' -> 'hydra_core' (a wheel file's distribution prefix, normalised)."""
    for sep in "=<>!~; ":
        req = req.split(sep)[0]
    return req.replace("-", "_").lower()


def find_wheel(wheels: Path, req: str) -> Path | None:
    found = [p for p in wheels.glob("*.whl") if p.name.lower().startswith(wheel_name(req) + "-")]
    return sorted(found)[-1] if found else None


def download(wheels: Path) -> list[Path]:
    """Every wheel of WHEELS in `wheels` (downloaded or built unless already there)."""
    wheels.mkdir(parents=True, exist_ok=True)
    out = []
    for req, how in WHEELS:
        have = find_wheel(wheels, req)
        if have is None:
            if how == "build":
                pip("wheel", "--no-deps", "-w", str(wheels), req)
            else:
                plats = [a for p in PLATFORMS for a in ("--platform", p)]
                abi = ["--implementation", "cp", "--abi", "cp312"] if how == "binary" else []
                pip(
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.12",
                    *abi,
                    *plats,
                    "-d",
                    str(wheels),
                    req,
                )
            have = find_wheel(wheels, req)
        if have is None:
            raise SystemExit(f"error: no wheel for {req} in {wheels} after pip")
        log(f"{have.name}: {have.stat().st_size / MIB:.1f} MiB")
        out.append(have)
    return out


def store_wheel(src: Path, dst: Path) -> None:
    """`src` rewritten with stored (uncompressed) members: same names, bytes and RECORD, so pip installs it
    as before, while xz compresses the raw contents far better than deflate's output."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED, allowZip64=True) as zout:
        for info in zin.infolist():
            new = zipfile.ZipInfo(info.filename, info.date_time)
            new.external_attr = info.external_attr
            new.compress_type = zipfile.ZIP_STORED
            with zin.open(info) as r, zout.open(new, "w", force_zip64=info.file_size > 2**31) as w:
                shutil.copyfileobj(r, w, 16 * MIB)


def source_tree(dest: Path, source: str) -> str:
    """This repository's source into `dest`: HEAD's (git archive) or the working tree's files. Returns the
    commit (with '+worktree' when the working tree was taken)."""
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    dest.mkdir(parents=True)
    if source == "head":
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD", *SOURCE_PATHS], cwd=ROOT, check=True, capture_output=True
        )
        with tempfile.TemporaryFile() as f:
            f.write(archive.stdout)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(dest, filter="data")
        # The check itself must travel even before it is committed.
        for rel in [
            *(str(p.relative_to(ROOT)) for p in (ROOT / "dev" / "gpu_check").glob("*.py")),
            "dev/gpu_install.sh",
        ]:
            if not (dest / rel).exists():
                log(f"warning: {rel} is not in HEAD; taken from the working tree")
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)
    else:
        files = subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard", "--", *SOURCE_PATHS],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split("\0")
        for rel in filter(None, files):
            if (ROOT / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)
        commit += "+worktree"
    (dest / "BUNDLE_COMMIT").write_text(commit + "\n")
    return commit


def pack(staging: Path, out: Path, part_bytes: int, threads: int = 0) -> list[Path]:
    """staging/* -> out/bundle.tar.xz.partNN + MANIFEST.sha256 + bundle.tar.xz.sha256 + install.sh."""
    if part_bytes < 1:
        raise SystemExit("error: the part size must be >= 1 byte")
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob(f"{ARCHIVE}*"), out / MANIFEST]:
        old.unlink(missing_ok=True)
    archive = out / ARCHIVE
    names = sorted(p.name for p in staging.iterdir())
    # Sorted, owner-free members; the small ones (source) first.
    names.sort(key=lambda n: (n == "wheels", n))
    tar_cmd = [
        "tar",
        "-C",
        str(staging),
        "--sort=name",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
        "-cf",
        "-",
        *names,
    ]
    xz_cmd = ["xz", "-9", f"-T{threads}", "-c"]
    log(f"$ {' '.join(tar_cmd)} | {' '.join(xz_cmd)} > {archive}")
    with open(archive, "wb") as f:
        tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE)
        xz = subprocess.run(xz_cmd, stdin=tar.stdout, stdout=f, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or xz.returncode != 0:
            raise SystemExit(f"error: tar ({tar.returncode}) or xz ({xz.returncode}) failed")
    whole = sha256_file(archive)
    (out / f"{ARCHIVE}.sha256").write_text(f"{whole}  {ARCHIVE}\n")
    parts: list[Path] = []
    with open(archive, "rb") as f:
        while chunk := f.read(part_bytes):
            part = out / f"{ARCHIVE}.part{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    if len(parts) > 100:
        raise SystemExit(f"error: {len(parts)} parts: raise the part size")
    archive.unlink()
    (out / MANIFEST).write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in parts))
    shutil.copy2(ROOT / "dev" / "gpu_install.sh", out / "install.sh")
    for p in parts:
        log(f"{p.name}: {p.stat().st_size / MIB:.2f} MiB")
    log(f"{len(parts)} parts, {sum(p.stat().st_size for p in parts) / MIB:.2f} MiB in all; sha256 {whole}")
    return parts


def pack_source(src: Path, out: Path) -> Path:
    """`src` as out/src.tar.xz (members under src/, owner-free) and its sha256 in out/src.tar.xz.sha256."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / SRC

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "__pycache__" in info.name.split("/"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(path, "w:xz", preset=9) as tar:
        tar.add(src, arcname="src", filter=clean)
    (out / f"{SRC}.sha256").write_text(f"{sha256_file(path)}  {SRC}\n")
    log(f"{SRC}: {path.stat().st_size / MIB:.2f} MiB")
    return path


def parts_intact(out: Path) -> bool:
    """Whether out/MANIFEST.sha256 lists parts that are all there with their sums."""
    try:
        lines = [line.split() for line in (out / MANIFEST).read_text().splitlines() if line.strip()]
    except OSError:
        return False
    return bool(lines) and all(
        len(x) == 2 and (out / x[1]).is_file() and sha256_file(out / x[1]) == x[0] for x in lines
    )


def build(args: argparse.Namespace) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    wheels = download(args.wheels or out / "wheels")
    lock = "".join(f"{sha256_file(w)}  {w.name}\n" for w in wheels) + f"part-bytes {int(args.part_mib * MIB)}\n"
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        if (out / LOCK).is_file() and (out / LOCK).read_text() == lock and parts_intact(out):
            log(f"the parts already hold these wheels ({LOCK}): not packed again")
        else:
            (out / LOCK).unlink(missing_ok=True)
            staging = Path(tmp) / "stage"
            (staging / "wheels").mkdir(parents=True)
            for w in wheels:
                log(f"storing {w.name}")
                store_wheel(w, staging / "wheels" / w.name)
            pack(staging, out, int(args.part_mib * MIB), args.threads)
            shutil.rmtree(staging)
            (out / LOCK).write_text(lock)
        commit = source_tree(Path(tmp) / "src", args.source)
        log(f"source: {commit} ({args.source})")
        pack_source(Path(tmp) / "src", out)
    shutil.copy2(ROOT / "dev" / "gpu_install.sh", out / "install.sh")
    parts = sorted(out.glob(ARCHIVE + ".part*"))
    sizes = ", ".join(f"{p.name} {p.stat().st_size / MIB:.1f}" for p in parts)
    log(f"ready in {out}: {sizes}, {SRC} {(out / SRC).stat().st_size / MIB:.2f} MiB")


def carry(args: argparse.Namespace) -> None:
    """Parts K... ("all": every part) and the manifests into <to> (emptied first): what one device call carries."""
    to: Path = args.to if args.to.is_absolute() else ROOT / args.to
    have = sorted(args.out.glob(ARCHIVE + ".part*"))
    if args.parts == ["all"]:
        parts = have
    else:
        parts = [args.out / f"{ARCHIVE}.part{int(k):02d}" for k in args.parts]
    missing = [p.name for p in parts if not p.is_file()]
    if missing or not parts:
        raise SystemExit(
            f"error: no {', '.join(missing) or 'parts'} in {args.out}; parts are: {', '.join(p.name for p in have)}"
        )
    if to.exists():
        shutil.rmtree(to)
    to.mkdir(parents=True)
    extras = [args.out / n for n in (MANIFEST, f"{ARCHIVE}.sha256", SRC, f"{SRC}.sha256")]
    for src in (*parts, *[p for p in extras if p.is_file()]):
        shutil.copy2(src, to / src.name)
    size = sum(p.stat().st_size for p in parts) / MIB
    log(f"{to}: {', '.join(p.name for p in parts)} ({size:.2f} MiB) + manifests and source")
    tree = working_tree_mib()
    total = tree + sum(p.stat().st_size for p in to.iterdir()) / MIB
    if total > 64:
        raise SystemExit(
            f"error: the working tree ({tree:.1f} MiB) and {to.name} ({total - tree:.1f} MiB) exceed the 64 MiB a "
            "device call carries: carry fewer parts, or rebuild with a smaller --part-mib"
        )
    log(f"a call carrying {to.name} sends about {total:.1f} MiB (working tree {tree:.1f} MiB) of the 64 allowed")


def working_tree_mib() -> float:
    """What a device call sends besides `carry`: git's tracked and untracked, not ignored, files."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()) / MIB


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, stage and pack everything")
    b.add_argument("--out", type=Path, default=Path("/tmp/gpu_bundle"))
    b.add_argument("--wheels", type=Path, default=None, help="wheel cache (default <out>/wheels)")
    b.add_argument("--part-mib", type=float, default=60.0)
    b.add_argument("--source", choices=["head", "worktree"], default="head")
    b.add_argument("--threads", type=int, default=0, help="xz threads (0: one per core)")
    k = sub.add_parser("pack", help="pack a staging directory into parts")
    k.add_argument("staging", type=Path)
    k.add_argument("--out", type=Path, required=True)
    size = k.add_mutually_exclusive_group()
    size.add_argument("--part-mib", type=float, default=60.0)
    size.add_argument("--part-bytes", type=int, default=None)
    k.add_argument("--threads", type=int, default=0)
    k.add_argument("--src", type=Path, default=None, help="also write DIR as src.tar.xz")
    c = sub.add_parser("carry", help="copy parts K... (or all) into the repository for a device call")
    c.add_argument("parts", nargs="+", help="part numbers, or: all")
    c.add_argument("--out", type=Path, default=Path("/tmp/gpu_bundle"))
    c.add_argument("--to", type=Path, default=Path(".gpu_bundle"))
    args = p.parse_args(argv)
    if args.cmd == "build":
        build(args)
    elif args.cmd == "pack":
        pack(args.staging, args.out, args.part_bytes or int(args.part_mib * MIB), args.threads)
        if args.src is not None:
            pack_source(args.src, args.out)
    else:
        carry(args)


if __name__ == "__main__":
    main()
