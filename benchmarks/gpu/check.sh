#!/usr/bin/env bash
# The GPU check (benchmarks/gpu/check.py), as one command for a lent GPU machine, from the
# repository root:
#   benchmarks/gpu/check.sh              on the GPU; results under $OUT (else ./gpu-check)
#   benchmarks/gpu/check.sh --dry-run    everything but the CUDA parts, on a CPU
# It first records the machine (GPU, driver, compute mode, memory, kernel, cores) in
# $OUT/log.txt, installs the wheels carried in .whl/ (benchmarks/gpu/fetch_wheels.sh: what
# the machine's image lacks) into /tmp/site, and stops at once (status 2) if megatron.core
# cannot be imported then (the device call did not carry .whl); then it runs the check under
# a time limit (CHECK_TIMEOUT_S, default 480 s: SIGTERM, which unwinds the worker pools and
# records the part cut off, then SIGKILL 20 s later).
# The interpreter: $PYTHON, else the checkout's .venv (the README's install) if it runs here,
# else python3 (a GPU machine's image: a .venv carried from another machine does not run).
set -euo pipefail
out="${OUT:-$PWD/gpu-check}"
default_python=python3
if [[ -x .venv/bin/python ]] && .venv/bin/python -c '' 2> /dev/null; then
    default_python=.venv/bin/python
fi
python="${PYTHON:-$default_python}"
mkdir -p "$out"
log="$out/log.txt"
{
    echo "== the machine ($(date -u +%FT%TZ))"
    memory=$(awk '/^MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
    echo "kernel: $(uname -r); cores: $(nproc); memory: $memory"
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total,memory.used \
            --format=csv || echo "nvidia-smi failed"
    else
        echo "no nvidia-smi"
    fi
    echo "python: $python ($("$python" --version 2>&1))"
} 2>&1 | tee "$log"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tee -a "$log" \
        || { echo "error: installing .whl/ failed" | tee -a "$log" >&2; exit 2; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! import_error=$("$python" -c 'import megatron.core' 2>&1); then
    {
        echo "$import_error" | tail -3
        echo "error: megatron.core cannot be imported by $python: on a lent machine, call the" \
            "device run with carry [\".whl\"] (benchmarks/gpu/fetch_wheels.sh fills .whl/)"
    } | tee -a "$log" >&2
    exit 2
fi
set +e
timeout --signal=TERM --kill-after=20 "${CHECK_TIMEOUT_S:-480}" \
    "$python" benchmarks/gpu/check.py --out "$out" "$@" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
set -e
echo "check exit status: $status (results in $out)" | tee -a "$log"
exit "$status"
