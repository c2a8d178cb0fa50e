#!/usr/bin/env bash
# The device check, on a machine with an NVIDIA GPU, its driver and NVRTC,
# and no Rust: build the binary here and carry it there, with a model file
# (a GPU machine may have no network; `bulkhead model trim` cuts the
# default model to a few layers, small enough to carry).
#
#   mkdir -p .gpu && echo /.gpu/ >> .git/info/exclude
#   cargo build --release --features cuda
#   strip -o .gpu/bulkhead target/release/bulkhead && xz -T0 -f .gpu/bulkhead
#   target/release/bulkhead model trim --layers 4 --out .gpu/small.gguf
#   (on the GPU machine) BULKHEAD=.gpu/bulkhead MODEL=.gpu/small.gguf scripts/gpu-check.sh
#
# It prints the device; the kernels against CPU references (paged
# attention, the Q4_1 matvec); the owner-tag refusal inside the attention
# kernel; the host-device copy rates; the golden prompts' greedy tokens on
# the GPU against the CPU engine's on the same model (and against
# llama.cpp's golden tokens when MODEL is the default model); the GPU's
# prefill and decode throughput; then `generate --device cuda`. It fails if
# any check fails. Well under 8 minutes.
set -euo pipefail
bin=${BULKHEAD:-./bulkhead}
if [ ! -x "$bin" ] && [ -f "$bin.xz" ]; then
  xz -d -k "$bin.xz"
  chmod +x "$bin"
fi
# NVRTC from a pip wheel sits outside the default search path.
for d in $(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null || true); do
  export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
model=()
if [ -n "${MODEL:-}" ]; then
  model=(--model "$MODEL")
fi
timeout 420 "$bin" gpu-check --device "${GPU:-0}" "${model[@]}"
echo "--- generate on the GPU:"
out=$(timeout 60 "$bin" generate --device "cuda:${GPU:-0}" "${model[@]}" --prompt "What is the capital of France?" --max-tokens 16 2>&1) || {
  case "$out" in
    *panicked*) echo "PANIC: $out" >&2 ;;
    *) echo "generate --device cuda failed: $out" >&2 ;;
  esac
  exit 1
}
echo "$out"
