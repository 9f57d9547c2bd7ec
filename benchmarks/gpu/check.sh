#!/usr/bin/env bash
# The GPU check (benchmarks/gpu/check.py), as one command for a lent GPU machine, from the
# repository root:
#   benchmarks/gpu/check.sh              on the GPU; results under $OUT (else ./gpu-check)
#   benchmarks/gpu/check.sh --dry-run    everything but the CUDA parts, on a CPU
# It first installs the wheels carried in .whl/ (benchmarks/gpu/fetch_wheels.sh: what the
# machine's image lacks) into /tmp/site, then runs the check under a time limit
# (CHECK_TIMEOUT_S, default 480 s: SIGTERM, which unwinds the worker pools, then SIGKILL).
# The interpreter: $PYTHON, else the checkout's .venv (the README's install), else python3
# (a GPU machine's image).
set -euo pipefail
out="${OUT:-$PWD/gpu-check}"
default_python=python3
[[ -x .venv/bin/python ]] && default_python=.venv/bin/python
python="${PYTHON:-$default_python}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
set +e
timeout --signal=TERM --kill-after=20 "${CHECK_TIMEOUT_S:-480}" \
    "$python" benchmarks/gpu/check.py --out "$out" "$@" 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}
set -e
echo "check exit status: $status (results in $out)"
exit "$status"
