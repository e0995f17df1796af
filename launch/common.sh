# Shared by the launchers (sourced, not run): checks, torchrun lookup, fabric env, command echo.
# Every launcher cds to the repository root first, so relative paths (outputs/, .venv/) are the repo's.
#   TORCHRUN    torchrun to use (default: python -m dlrm.torchrun of $DLRM_VENV, .venv by default, else
#               torchrun on PATH); see find_torchrun
#   FABRIC_ENV  NCCL/Gloo settings to source: a name in launch/env/ (nccl_ib, nccl_socket, nccl_base,
#               gloo_cpu), a path to your own file, or none. Each launcher picks a default and prints it.
#   DRY_RUN=1   print the command and exit 0 without running it.
# It sets arrays the launchers read (TORCHRUN_CMD, LOCAL_RDZV_ARGS, RESTART_ARGS):
# shellcheck disable=SC2034

# die MESSAGE...: the launcher refuses to start (exit 2), naming the variable and the fix.
die() {
  echo "error: $*" >&2
  exit 2
}

# require_int NAME MIN: $NAME must be set to an integer >= MIN.
require_int() {
  local name=$1 min=$2 value=${!1-}
  [ -n "$value" ] || die "$name is not set; set it to an integer >= $min (e.g. $name=$min)"
  [[ "$value" =~ ^[0-9]+$ ]] || die "$name=$value is not an integer; set it to an integer >= $min (e.g. $name=$min)"
  [ "$((10#$value))" -ge "$min" ] || die "$name=$value is below $min; set it to an integer >= $min"
}

# detect_accel: DLRM_ACCEL (cpu | cuda | rocm), else cuda if nvidia-smi lists a GPU, else cpu (as launch/setup.sh).
# rocm becomes cuda here: torch's ROCm build answers to device 'cuda' and runs RCCL behind 'nccl'.
detect_accel() {
  if [ -z "${DLRM_ACCEL:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DLRM_ACCEL=cuda; else DLRM_ACCEL=cpu; fi
  fi
  case "$DLRM_ACCEL" in
    cpu|cuda) ;;
    rocm) DLRM_ACCEL=cuda ;;
    *) die "DLRM_ACCEL=$DLRM_ACCEL is not cpu, cuda or rocm; unset it to detect, or set DLRM_ACCEL=cpu|cuda|rocm" ;;
  esac
}

# find_torchrun: sets TORCHRUN_CMD, the launcher command (an array):
#   TORCHRUN set: that torchrun, as given (its failure summary included);
#   else the venv's python -m dlrm.torchrun (torchrun's own launcher, which ends a user error with its
#   one `error:` line and exit 2 instead of torchrun's failure summary; other failures get the summary);
#   else python3 -m dlrm.torchrun when python3 on PATH has torch (a container without a venv);
#   else torchrun on PATH.
find_torchrun() {
  local venv=${DLRM_VENV:-.venv}
  if [ -n "${TORCHRUN:-}" ]; then
    TORCHRUN_CMD=("$TORCHRUN")
  elif [ -x "$venv/bin/python" ]; then
    TORCHRUN_CMD=("$venv/bin/python" -m dlrm.torchrun)
  elif command -v python3 >/dev/null 2>&1 &&
    python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
    TORCHRUN_CMD=(python3 -m dlrm.torchrun)
  elif command -v torchrun >/dev/null 2>&1; then
    TORCHRUN_CMD=(torchrun)
  else
    die "no torchrun found (no $venv/bin/python, no torchrun on PATH); run 'bash launch/setup.sh' or set TORCHRUN=/path/to/torchrun"
  fi
}

# LOCAL_RDZV_ARGS: a one-node rendezvous on loopback, as --standalone but at 127.0.0.1 on a free port
# (port 0: the OS picks it). The workers then reach the store by 127.0.0.1. torchrun's store (a TCPStore)
# still listens on every interface whatever address it is given; see launch/README.md ("Network exposure").
LOCAL_RDZV_ARGS=(--nnodes=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:0 --rdzv-id=local)  # the store is this job's own: any id will do

# list_names DIR SUFFIX: the names of DIR's files ending in SUFFIX, without it, space-separated.
list_names() {
  local f
  for f in "$1"/*"$2"; do f=${f##*/}; printf '%s ' "${f%"$2"}"; done
}

# load_fabric_env DEFAULT: source launch/env/$FABRIC_ENV.sh (FABRIC_ENV defaults to DEFAULT; none = nothing).
load_fabric_env() {
  FABRIC_ENV=${FABRIC_ENV:-$1}
  local file
  case "$FABRIC_ENV" in
    none|"") echo "fabric env: none (FABRIC_ENV=none)" >&2; return 0 ;;
    */*|*.sh) file=$FABRIC_ENV ;;
    *) file=launch/env/$FABRIC_ENV.sh ;;
  esac
  if [ ! -f "$file" ]; then
    local names
    names=$(list_names launch/env .sh)
    die "FABRIC_ENV=$FABRIC_ENV: no file $file; use one of: ${names}none, or a path to your own env file"
  fi
  # shellcheck source=/dev/null
  source "$file"
  echo "fabric env: $file (FABRIC_ENV=$FABRIC_ENV)" >&2
  if [ "${DRY_RUN:-0}" = 1 ]; then
    env | grep -E '^(NCCL_|TORCH_NCCL_|GLOO_|OMP_NUM_THREADS=)' | sort | sed 's/^/  /' >&2 || true
  fi
}

# has_override PREFIX ARGS...: whether a Hydra override starting with PREFIX is among ARGS.
has_override() {
  local prefix=$1 a
  shift
  for a in "$@"; do
    case "$a" in "$prefix"*|"+$prefix"*|"++$prefix"*) return 0 ;; esac
  done
  return 1
}

# override_value KEY ARGS...: the value of the last `KEY=value` override among ARGS (empty if none).
override_value() {
  local key=$1 a value=
  shift
  for a in "$@"; do
    case "$a" in "$key="*|"+$key="*|"++$key="*) value=${a#*"$key="} ;; esac
  done
  printf '%s' "$value"
}

# option_value SHORT LONG ARGS...: the value of the last `SHORT VALUE`, `LONG VALUE` or `LONG=VALUE` among
# ARGS (empty if none): dlrm.train's -cd/--config-dir and -cn/--config-name, which Hydra reads so.
option_value() {
  local short=$1 long=$2 a prev='' value=''
  shift 2
  for a in "$@"; do
    if [ "$prev" = "$short" ] || [ "$prev" = "$long" ]; then value=$a; fi
    case "$a" in "$long="*) value=${a#*=} ;; esac
    prev=$a
  done
  printf '%s' "$value"
}

# config_dir ARGS...: the directory of `-cd DIR` among ARGS (empty if none); dies if it is not a directory.
config_dir() {
  local dir
  dir=$(option_value -cd --config-dir "$@")
  if [ -n "$dir" ] && [ ! -d "$dir" ]; then
    die "-cd $dir: no directory $dir (relative paths are from the repository root, where the launchers run; give an absolute path, the same on every node)"
  fi
  printf '%s' "$dir"
}

# config_group_file GROUP NAME ARGS...: the YAML file dlrm.train reads for `GROUP=NAME`: in the directory of
# `-cd DIR` among ARGS first (Hydra's --config-dir comes before conf/), then in conf/. Dies naming both.
config_group_file() {
  local group=$1 name=$2 dir
  shift 2
  dir=$(config_dir "$@") || exit 2
  if [ -n "$dir" ] && [ -f "$dir/$group/$name.yaml" ]; then printf '%s' "$dir/$group/$name.yaml"; return 0; fi
  [ -f "conf/$group/$name.yaml" ] && { printf '%s' "conf/$group/$name.yaml"; return 0; }
  local choices
  choices=$(list_names "conf/$group" .yaml)
  [ -n "$dir" ] && [ -d "$dir/$group" ] && choices+=$(list_names "$dir/$group" .yaml)
  die "$group=$name: no file ${dir:+$dir/$group/$name.yaml or }conf/$group/$name.yaml; choose one of: $choices"
}

# check_topology NNODES_VAR NPROC_VAR ARGS...: when ARGS choose `topology=NAME`, compare the config's
# nodes / ranks_per_node (after topology.nodes= / topology.ranks_per_node= overrides) with the launcher's,
# so a mismatch is refused here rather than after every rank has started. NNODES_VAR - means one node.
# The topology file is looked up as dlrm.train does (config_group_file: -cd DIR, then conf/).
check_topology() {
  local nnodes_var=$1 nproc_var=$2
  shift 2
  local name file nodes rpn
  config_dir "$@" >/dev/null || exit 2
  name=$(override_value topology "$@")
  [ -n "$name" ] || return 0
  file=$(config_group_file topology "$name" "$@") || exit 2
  nodes=$(override_value topology.nodes "$@")
  [ -n "$nodes" ] || nodes=$(sed -n 's/^nodes:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$file")
  rpn=$(override_value topology.ranks_per_node "$@")
  [ -n "$rpn" ] || rpn=$(sed -n 's/^ranks_per_node:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$file")
  if [ "$nnodes_var" = - ]; then  # a single-node launcher
    if [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" != 1 ]; then
      die "topology '$name' has $nodes nodes${rpn:+ x $rpn ranks} but this launcher runs one node of $nproc_var=${!nproc_var} ranks; use launch/run_multinode.sh (NNODES=$nodes) or pass topology.nodes=1"
    fi
  elif [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" != "${!nnodes_var}" ]; then
    die "$nnodes_var=${!nnodes_var} but topology '$name' has $nodes node(s); set $nnodes_var=$nodes or pass topology.nodes=${!nnodes_var}"
  fi
  if [[ "$rpn" =~ ^[0-9]+$ ]] && [ "$rpn" != "${!nproc_var}" ]; then
    die "$nproc_var=${!nproc_var} but topology '$name' has $rpn ranks per node; set $nproc_var=$rpn or pass topology.ranks_per_node=${!nproc_var}"
  fi
}

# numa_args: NUMA_ARGS, torchrun's --numa-binding=$NUMA_BINDING on GPUs: each rank (and its threads) runs
# on the CPUs of its GPU's NUMA node (torch.numa.binding; it needs the numactl command). NUMA_BINDING:
# node (the default on GPUs where numactl is installed), socket, exclusive, core-complex, or none.
numa_args() {
  NUMA_ARGS=()
  local mode=${NUMA_BINDING:-}
  if [ -z "$mode" ]; then
    [ "$DLRM_ACCEL" = cuda ] || return 0
    if ! command -v numactl >/dev/null 2>&1; then
      echo "numa binding: none (no numactl command: install numactl to bind each rank to its GPU's NUMA node)" >&2
      return 0
    fi
    mode=node
  fi
  case "$mode" in
    none) return 0 ;;
    node|socket|exclusive|core-complex) ;;
    *) die "NUMA_BINDING=$mode: use node, socket, exclusive, core-complex or none" ;;
  esac
  command -v numactl >/dev/null 2>&1 || die "NUMA_BINDING=$mode needs the numactl command: install numactl, or set NUMA_BINDING=none"
  NUMA_ARGS=(--numa-binding="$mode")
}

# quote_args ARGS...: the arguments as one shell-pasteable line (quotes only where needed).
quote_args() {
  local out=() a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  printf '%s' "${out[*]}"
}

# restart_args: --max-restarts=$MAX_RESTARTS when MAX_RESTARTS is set (torchrun restarts every rank
# of the job that many times after a failure; pair it with trainer.resume=auto and checkpoint.every_steps).
restart_args() {
  RESTART_ARGS=()
  if [ -n "${MAX_RESTARTS:-}" ]; then
    require_int MAX_RESTARTS 0
    RESTART_ARGS=(--max-restarts="$MAX_RESTARTS")
  fi
}

# run_cmd ARGS...: print '+ command' to stderr, then exec it (or exit 0 under DRY_RUN=1).
run_cmd() {
  echo "+ $(quote_args "$@")" >&2
  [ "${DRY_RUN:-0}" = 1 ] && exit 0
  exec "$@"
}

case "${DRY_RUN:-0}" in
  0|1) ;;
  *) die "DRY_RUN=$DRY_RUN: use DRY_RUN=1 (print the command only) or DRY_RUN=0 / unset (run it)" ;;
esac
