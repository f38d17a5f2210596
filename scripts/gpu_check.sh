#!/usr/bin/env bash
# GPU check of pcpcheck: run the checker with every tensor, collective and cache write on GPUs.
#
#   scripts/gpu_check.sh [TARGET] [extra pcpcheck check options]
#
#   TARGET defaults to `impl` (the bundled gather); e.g. scripts/gpu_check.sh path/to/pcp.py.
#   MAX_EXAMPLES (default 200) and TIMEOUT (default 60 s per case) tune the run.
#
# What it does, by the number of GPUs torch sees:
#   >= 2 GPUs  real ranks: pcpcheck check --backend nccl --world-sizes 2[,4][,N]
#              (one process per rank, rank r on cuda:r, NCCL all_gather, cache written on cuda:r)
#   1 GPU      in-process ranks on that GPU: pcpcheck check --backend threads --device cuda
#              (inputs, all_gathers and the cache write on cuda:0)
#   0 GPUs     fails (exit 3) with one line: there is nothing to check on a GPU here.
# It prints which mode it ran; its exit code is pcpcheck's (0 holds, 1 violation, 2 usage/load).
set -euo pipefail
cd "$(dirname "$0")/.."

target="${1:-impl}"
[[ $# -gt 0 ]] && shift
max_examples="${MAX_EXAMPLES:-200}"
timeout_s="${TIMEOUT:-60}"

gpus="$(python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)"

if [[ "$gpus" -ge 2 ]]; then
    sizes="2"
    [[ "$gpus" -ge 4 ]] && sizes="$sizes,4"
    top=$(( gpus > 8 ? 8 : gpus ))
    [[ "$top" -ne 2 && "$top" -ne 4 ]] && sizes="$sizes,$top"
    echo "gpu_check: $gpus GPUs: real ranks, backend nccl, world sizes $sizes"
    set -x
    exec python -m pcpcheck check "$target" --backend nccl --world-sizes "$sizes" \
        --max-examples "$max_examples" --timeout "$timeout_s" "$@"
elif [[ "$gpus" -eq 1 ]]; then
    echo "gpu_check: 1 GPU: in-process ranks (threads backend), every tensor and the cache on cuda:0"
    set -x
    exec python -m pcpcheck check "$target" --backend threads --device cuda \
        --max-examples "$max_examples" --timeout "$timeout_s" "$@"
else
    echo "gpu_check: no CUDA GPU visible to torch (torch.cuda.device_count() = 0): nothing to check on a GPU" >&2
    exit 3
fi
