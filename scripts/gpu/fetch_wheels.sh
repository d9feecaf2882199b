#!/usr/bin/env bash
# Download the wheels the GPU machine lacks (it has torch, triton, transformers, accelerate but no
# diffusers / cache-dit and no package index; not importlib_metadata: Python 3.12 there has importlib.metadata,
# which diffusers uses, and importlib_metadata 10.x would need lazy_importer) into .whl/ at the repository root (git-ignored).
# Run here, before a GPU session; then pass carry=[".whl"] to the device tool's run and start the
# command with scripts/gpu/stages.sh, which installs them into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl diffusers==0.42.1 cache-dit==1.5.3
ls -la .whl
