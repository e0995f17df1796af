#!/usr/bin/env bash
# Install a bundle made by dev/gpu_bundle.py on a bare GPU machine, then run the acceptance check
# (dev/gpu_check). The bundle carries it as install.sh; the repository's copy is the same file.
#   bash install.sh [--bundle DIR] [--dest DIR] [--src DIR] [--no-install] [--no-run] [-- gpu_check args]
#   --bundle  the parts, MANIFEST.sha256 and bundle.tar.xz.sha256 (default: this script's directory if it
#             holds MANIFEST.sha256, else /tmp/gpu_bundle)
#   --dest    where the archive is unpacked (wheels/, src/) and the wheels installed (site/); default
#             /tmp/dlrm_gpu
#   --src     run the check from this source tree instead of the bundle's src/ (e.g. a repository copy)
#   --no-install / --no-run: stop after unpacking / after installing
# Steps: every part is checked against MANIFEST.sha256 (a missing or corrupt part is named, nothing is
# unpacked); the parts are joined in the manifest's order and the whole checked against
# bundle.tar.xz.sha256; unpacked (xz, else Python's lzma), then src.tar.xz if there (checked against
# src.tar.xz.sha256; it replaces any src/ of the parts); `pip install --no-index --no-deps` of
# wheels/*.whl into DEST/site; then `python3 dev/gpu_check ARGS` in the source tree with
# PYTHONPATH=DEST/site first. PYTHON chooses the interpreter (default python3).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f $here/MANIFEST.sha256 ]]; then bundle=$here; else bundle=/tmp/gpu_bundle; fi
dest=/tmp/dlrm_gpu
src=
install=1
run=1
PY=${PYTHON:-python3}
while (($#)); do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --dest) dest=$2; shift 2 ;;
    --src) src=$2; shift 2 ;;
    --no-install) install=0; run=0; shift ;;
    --no-run) run=0; shift ;;
    --) shift; break ;;
    *) echo "error: unknown argument '$1'; usage: install.sh [--bundle DIR] [--dest DIR] [--src DIR] [--no-install] [--no-run] [-- gpu_check args]" >&2; exit 2 ;;
  esac
done
say() { echo "[gpu_install] $*"; }
manifest=$bundle/MANIFEST.sha256
[[ -f $manifest ]] || { echo "error: no $manifest: pass --bundle DIR (where the parts were copied)" >&2; exit 2; }
[[ -f $bundle/bundle.tar.xz.sha256 ]] || { echo "error: no $bundle/bundle.tar.xz.sha256 beside the manifest" >&2; exit 2; }

# 1. every part there and intact
parts=()
missing=()
while read -r _ name; do
  [[ -n $name ]] || continue
  parts+=("$name")
  [[ -f $bundle/$name ]] || missing+=("$name")
done <"$manifest"
((${#parts[@]})) || { echo "error: $manifest lists no parts" >&2; exit 2; }
if ((${#missing[@]})); then
  echo "error: ${#missing[@]} of ${#parts[@]} parts missing in $bundle: ${missing[*]}; copy them there first (dev/README.md)" >&2
  exit 1
fi
if ! bad=$(cd "$bundle" && sha256sum -c --quiet MANIFEST.sha256 2>&1); then
  echo "error: parts that do not match MANIFEST.sha256 (copy them again): ${bad//$'\n'/; }" >&2
  exit 1
fi
say "${#parts[@]} parts verified ($(cd "$bundle" && du -cb "${parts[@]}" | tail -1 | cut -f1) bytes)"

# 2. joined and checked as a whole
mkdir -p "$dest"
archive=$dest/bundle.tar.xz
(cd "$bundle" && cat "${parts[@]}") >"$archive"
want=$(cut -d' ' -f1 "$bundle/bundle.tar.xz.sha256")
got=$(sha256sum "$archive" | cut -d' ' -f1)
[[ $want == "$got" ]] || { echo "error: the joined archive's sha256 $got is not bundle.tar.xz.sha256's $want" >&2; exit 1; }

# 3. unpacked
rm -rf "$dest/wheels" "$dest/src"
if command -v xz >/dev/null; then
  xz -dc -T0 "$archive" | tar -x -C "$dest"
else
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' "$archive" "$dest"
fi
rm -f "$archive"
# the source, apart from the parts (dev/gpu_bundle.py build writes it on its own, small)
if [[ -f $bundle/src.tar.xz ]]; then
  (cd "$bundle" && sha256sum -c --quiet src.tar.xz.sha256) ||
    { echo "error: $bundle/src.tar.xz does not match src.tar.xz.sha256 (copy both again)" >&2; exit 1; }
  rm -rf "$dest/src"
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
    "$bundle/src.tar.xz" "$dest"
fi
say "unpacked into $dest${src:+ (the check runs from $src)}"
((install)) || exit 0

# 4. installed, no registry
shopt -s nullglob
wheels=("$dest"/wheels/*.whl)
if ((${#wheels[@]})); then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$dest/site" "${wheels[@]}"
  say "installed ${#wheels[@]} wheels into $dest/site"
fi
export PYTHONPATH=$dest/site${PYTHONPATH:+:$PYTHONPATH}
"$PY" - <<'EOF' || true
from importlib import metadata
names = ("torch", "fbgemm-gpu", "torchrec", "tensordict", "torchmetrics", "hydra-core")
def version(n):
    try:
        return metadata.version(n)
    except metadata.PackageNotFoundError:
        return None
print("[gpu_install] versions:", ", ".join(f"{n} {version(n)}" for n in names), flush=True)
EOF
((run)) || exit 0

# 5. the check
src=${src:-$dest/src}
[[ -f $src/dev/gpu_check/__main__.py ]] || { echo "error: no dev/gpu_check/__main__.py in $src" >&2; exit 2; }
cd "$src"
say "$PY dev/gpu_check $*"
exec "$PY" dev/gpu_check "$@"
