#!/usr/bin/env bash
# GPU benchmark on the GPUs of one node (python -m dlrm.bench.training under torchrun): the bench_cpu shape and
# the MLPerf DLRM-DCNv2 shape (tables capped at 2M rows), each in fp32 (TF32 matmuls) and bf16, 8192
# samples per GPU per step, trained on 16 materialised batches per rank; each run prints samples/s
# (median of timed windows), peak CUDA memory, the source's own speed, and a profile of 10 steps (the
# top kernels, then ms per step of each phase: on the training thread and of GPU time); and TorchRec's
# own DLRM example at the bench_cpu shape (the real script of the checkout EXAMPLE names, run by
# dlrm/bench/example_timer.py, pinned batches, EXAMPLE_STEPS; skipped without EXAMPLE).
# Then the synthetic source alone (python -m dlrm.bench.training --source-only, one process, SOURCE_STEPS):
# samples/s per rank made on the GPU and on the host, against the 1.7M per GPU of MLPerf DCNv2; last,
# training on batches made on the GPU as it trains (no materialised batches), with fp16 tables, with
# the dense arch compiled (trainer.compile_dense), and with the GPU synchronized after every step
# (trainer.sync_every_step=true, the old behaviour, beside the default that lets the host run ahead).
#   NGPU         GPUs to use (default: all that nvidia-smi lists)
#   OUT_DIR      where each run's JSON goes (default outputs/bench_gpu)
#   PYTHON       interpreter (default python3); RUN_TIMEOUT seconds per run (default 240)
#   EXAMPLE      a checkout of https://github.com/facebookresearch/dlrm (its torchrec_dlrm/dlrm_main.py)
#   BUDGET_S     start no run after this many seconds (default: no limit), for a time-limited lease
#   BATCH_PER_GPU (8192), MAX_TABLE_ROWS (2000000), STEPS (the dlrm.bench.training step options), TOPOLOGY
#   (dgx_h100): smaller values give a quick check, e.g. on CPU: TOPOLOGY=cpu NGPU=1 BATCH_PER_GPU=64
#   MAX_TABLE_ROWS=1000 STEPS="--warmup 1 --window 1 --windows 1 --profile 1" SOURCE_STEPS="--warmup 1
#   --window 1 --windows 1" EXAMPLE_STEPS="--warmup 1 --window 1 --windows 1" DEVICE=cpu launch/bench_gpu.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
BATCH_PER_GPU=${BATCH_PER_GPU:-8192}
MAX_TABLE_ROWS=${MAX_TABLE_ROWS:-2000000}
read -r -a steps <<< "${STEPS:---warmup 30 --window 50 --windows 8 --profile 10}"
OUT_DIR=${OUT_DIR:-outputs/bench_gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
common=(--cache-batches 16 "${steps[@]}" --profile-rows 20
        "topology=${TOPOLOGY:-dgx_h100}" "topology.ranks_per_node=$NGPU" "data.global_batch_size=$((BATCH_PER_GPU * NGPU))"
        trainer.progress=none)
read -r -a source_steps <<< "${SOURCE_STEPS:---warmup 5 --window 20 --windows 5}"
read -r -a example_steps <<< "${EXAMPLE_STEPS:---warmup 30 --window 50 --windows 8}"
status=0
in_budget() {
  if [[ -n ${BUDGET_S:-} ]] && ((SECONDS >= BUDGET_S)); then
    echo "== $1: skipped (${SECONDS} s spent, BUDGET_S=$BUDGET_S)"
    status=1
    return 1
  fi
}
source_speed() {
  local name=$1; shift
  in_budget "$name" || return
  echo "== $name: $*"
  timeout "${RUN_TIMEOUT:-240}" "$PY" -m dlrm.bench.training --source-only --device "${DEVICE:-cuda}" "${source_steps[@]}" \
    "topology=${TOPOLOGY:-dgx_h100}" "topology.ranks_per_node=$NGPU" "data.global_batch_size=$((BATCH_PER_GPU * NGPU))" \
    --out "$OUT_DIR/$name.json" "$@" || { echo "== $name failed ($?)"; status=1; }
}
run() {
  local name=$1; shift
  in_budget "$name" || return
  echo "== $name: $*"
  timeout "${RUN_TIMEOUT:-240}" "$PY" -m torch.distributed.run --standalone "--nproc_per_node=$NGPU" \
    -m dlrm.bench.training "${common[@]}" --out "$OUT_DIR/$name.json" "$@" || { echo "== $name failed ($?)"; status=1; }
}
run cpu_shape_fp32 experiment=bench_cpu
run cpu_shape_bf16 experiment=bench_cpu trainer.dense_precision=bf16
if [[ -z ${EXAMPLE:-} ]]; then
  echo "== torchrec_example: skipped (set EXAMPLE to a checkout of facebookresearch/dlrm)"
elif in_budget torchrec_example; then
  echo "== torchrec_example: ${example_steps[*]}"
  # the example picks the device itself (CUDA and NCCL when there is a GPU)
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${RUN_TIMEOUT:-240}" "$PY" -m torch.distributed.run --standalone \
    "--nproc_per_node=$NGPU" dlrm/bench/example_timer.py --example "$EXAMPLE" "${example_steps[@]}" \
    --out "$OUT_DIR/torchrec_example.json" -- --batch_size "$BATCH_PER_GPU" --num_embeddings 100000 --embedding_dim 16 \
    --dense_arch_layer_sizes 512,256,64,16 --over_arch_layer_sizes 512,256,1 --learning_rate 0.1 --pin_memory ||
    { echo "== torchrec_example failed ($?)"; status=1; }
fi
run dcnv2_fp32 experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS"
run dcnv2_bf16 experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS" trainer.dense_precision=bf16
source_speed source_dcnv2_device experiment=bench_dcnv2
source_speed source_dcnv2_host experiment=bench_dcnv2 data.synthetic.on_device=false
source_speed source_cpu_shape_device experiment=bench_cpu
run dcnv2_fp32_live experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS" --cache-batches 0
run dcnv2_bf16_fp16_tables experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS" trainer.dense_precision=bf16 \
  model.embedding_precision=fp16
run dcnv2_bf16_compiled experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS" trainer.dense_precision=bf16 \
  trainer.compile_dense=true
# the host waits for the GPU after every step (as every H200 figure before it was measured): beside dcnv2_bf16
run dcnv2_bf16_sync_every_step experiment=bench_dcnv2 --max-table-rows "$MAX_TABLE_ROWS" trainer.dense_precision=bf16 \
  trainer.sync_every_step=true
exit $status
