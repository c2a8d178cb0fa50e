#!/usr/bin/env bash
# The device check, on a machine with an NVIDIA GPU, its driver and NVRTC,
# and no Rust: build the binary here and carry it there.
#
#   cargo build --release --features cuda && strip -o bulkhead target/release/bulkhead
#   (on the GPU machine) BULKHEAD=./bulkhead scripts/gpu-check.sh
#
# It prints the device, the kernels' comparison with the CPU (paged
# attention and the Q4_1 matvec), the owner-tag refusal inside the
# attention kernel, and the host-device copy rates; it fails if any check
# fails. Then it asks the worker for the GPU engine, which this build does
# not have yet: that answer is one sentence, never a panic. Well under 8
# minutes (seconds, in fact).
set -euo pipefail
bin=${BULKHEAD:-./bulkhead}
# NVRTC from a pip wheel sits outside the default search path.
for d in $(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "lib"))' 2>/dev/null || true); do
  export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout 420 "$bin" gpu-check --device "${GPU:-0}"
echo "--- the worker asked for the GPU:"
if out=$(timeout 60 "$bin" generate --device cuda --prompt hi 2>&1); then
  echo "$out"
else
  case "$out" in
    *panicked*) echo "PANIC: $out" >&2; exit 1 ;;
    *) echo "$out" ;;
  esac
fi
