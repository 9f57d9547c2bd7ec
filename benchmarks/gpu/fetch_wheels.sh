#!/usr/bin/env bash
# The wheels the GPU machine's image lacks (it has Python 3.12 and torch, numpy, packaging,
# click, pyyaml, pandas, seaborn; not megatron-core), for CPython 3.12 on x86-64 Linux, into
# .whl/ (git ignores it), for a GPU machine with no index to install from: copy .whl/ there
# with the checkout, and check.sh installs it. Run from the repository root, where pip can
# reach an index.
set -euo pipefail
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl megatron-core==0.16.1
ls -l .whl
