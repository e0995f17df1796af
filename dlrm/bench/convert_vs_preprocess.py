"""Benchmark: rows/s of the Parquet converter against Criteo preprocessing on the same rows.

    python -m dlrm.bench.convert_vs_preprocess                 # 1M rows, 2 rounds
    python -m dlrm.bench.convert_vs_preprocess --rows 200000 --rounds 1

Writes `--rows` Criteo rows (the shared sample rows, or `--sample`, repeated with their ids varied)
once as a raw TSV day (no header) and once with a header line, then times each command with its
defaults in a fresh process, alternating which goes first. Prints rows/s per command and round, and
the converter's ratio to preprocessing in the same round.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


def write_rows(sample: Path, rows: int, raw: Path, with_header: Path) -> None:
    """`rows` lines built from the sample's: copy r takes line r % n with its hex ids xor-ed by r // n."""
    lines = [line.split("\t") for line in sample.read_text().splitlines() if line]
    with open(raw, "w") as out, open(with_header, "w") as headed:
        headed.write("\t".join(HEADER) + "\n")
        for r in range(rows):
            fields = list(lines[r % len(lines)])
            salt = r // len(lines)
            for i in range(14, 40):
                if fields[i]:
                    fields[i] = f"{int(fields[i], 16) ^ salt:08x}"
            text = "\t".join(fields) + "\n"
            out.write(text)
            headed.write(text)


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sample", type=Path, default=ROOT.parent / "shared" / "data" / "criteo_sample.tsv")
    ap.add_argument("--dir", default=None, help="where to write (default: the system's temporary directory)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convert-bench-", dir=args.dir))
    try:
        raw, headed = work / "day_0.tsv", work / "rows.tsv"
        write_rows(args.sample, args.rows, raw, headed)
        print(f"{args.rows:,} rows: {raw.stat().st_size / 2**20:.0f} MB of text", flush=True)
        commands = {
            "preprocess": ["-m", "dlrm.data.criteo.preprocess", str(raw), "--out", str(work / "npy")],
            "convert": ["-m", "dlrm.data.convert", str(headed), "--delimiter", "tab", "--out", str(work / "pq")],
        }
        seconds: dict[str, list[float]] = {name: [] for name in commands}
        for n in range(args.rounds):
            for name in commands if n % 2 == 0 else list(commands)[::-1]:
                shutil.rmtree(work / "npy", ignore_errors=True)
                shutil.rmtree(work / "pq", ignore_errors=True)
                seconds[name].append(timed(commands[name]))
                print(f"round {n + 1} {name:10}: {args.rows / seconds[name][-1]:10,.0f} rows/s", flush=True)
        ratios = [p / c for p, c in zip(seconds["preprocess"], seconds["convert"], strict=True)]
        for name, s in seconds.items():
            print(f"{name:10}: median {args.rows / statistics.median(s):10,.0f} rows/s")
        print(f"convert / preprocess speed: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
