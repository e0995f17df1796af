"""Where launch/setup.sh takes torch from on a CPU machine (standard library only; runs before setup).

    pip install --dry-run --ignore-installed --no-deps --report - torch==VERSION | python launch/torch_wheel.py VERSION

Reads pip's installation report for torch==VERSION resolved from the configured indexes (pip.conf,
PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS) on stdin, possibly empty when nothing resolved.
Prints the arguments for `pip install`, one per line, and on stderr what it chose and why:

- the configured indexes resolve a CPU build (a `+cpu` version, as from a local mirror or PyTorch's
  CPU index): that exact version, `torch==VERSION+cpu`, from them (a plain `torch==VERSION` lets an
  installer prefer another index's CUDA build);
- anything else (PyPI's Linux wheel is the CUDA build; or nothing resolved): the CPU build
  `torch==VERSION+cpu` from PyTorch's CPU wheel index, added with --extra-index-url.
"""

from __future__ import annotations

import json
import sys
from urllib.parse import unquote

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def resolved_torch(report: dict) -> tuple[str, str]:
    """(version, wheel URL) of torch in a pip report, or ("", "") when the report holds none."""
    for item in report.get("install", []):
        meta = item.get("metadata", {})
        if str(meta.get("name", "")).lower() == "torch":
            return str(meta.get("version", "")), str(item.get("download_info", {}).get("url", ""))
    return "", ""


def choose(report: dict, version: str) -> tuple[list[str], str]:
    """(pip install arguments, what was decided and why) for torch==version on a CPU machine."""
    found, url = resolved_torch(report)
    if found.endswith("+cpu") or "+cpu" in unquote(url):
        return [f"torch=={found}"], f"torch {found} from the configured indexes ({url})"
    why = (
        f"the configured indexes offer {url or found} (not a CPU build)"
        if found
        else (f"the configured indexes offer no torch=={version}")
    )
    return (
        ["--extra-index-url", CPU_INDEX, f"torch=={version}+cpu"],
        f"{why}; taking torch {version}+cpu from PyTorch's CPU wheel index {CPU_INDEX}",
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python launch/torch_wheel.py VERSION < pip-report.json", file=sys.stderr)
        return 2
    text = sys.stdin.read().strip()
    try:
        report = json.loads(text) if text else {}
    except json.JSONDecodeError:
        report = {}  # pip printed something else: treat as nothing resolved
    args, message = choose(report, argv[0])
    print(f"setup: {message}", file=sys.stderr)
    print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
