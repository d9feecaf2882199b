#!/usr/bin/env bash
# Prepare .peers/ (git-ignored) for `stages.sh ar-official`: the official SJD and SCD code (only the folders the
# side-by-side imports) and the wheels of the transformers they pin, for Python 3.12 on x86-64. Never committed.
#
#   bash scripts/gpu/fetch_peers.sh [SJD_SOURCE] [SCD_SOURCE]
#
# A SOURCE is a git URL (default: the GitHub repositories) or a local git directory (bare or not). Then carry
# ".peers" to the GPU machine: run(command="bash scripts/gpu/stages.sh ar-official", carry=[".peers"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
sjd_src="${1:-https://github.com/tyshiwo1/Accelerating-T2I-AR-with-SJD}"
scd_src="${2:-https://github.com/junhyukso/SCD}"
rm -rf .peers && mkdir -p .peers/sjd .peers/scd
export_tree() {  # export_tree SOURCE DEST PATHS...: the named folders of SOURCE's HEAD into DEST, and its commit
  local src="$1" dest="$2"; shift 2
  local gitdir="$src"
  if [ ! -d "$src" ]; then
    gitdir="$(mktemp -d)"; git clone -q --bare --filter=blob:none "$src" "$gitdir"
  elif [ -d "$src/.git" ]; then
    gitdir="$src/.git"
  fi
  git --git-dir="$gitdir" archive HEAD "$@" | tar -x -C "$dest"
  git --git-dir="$gitdir" rev-parse HEAD > "$dest.commit"
}
export_tree "$sjd_src" .peers/sjd llamagen scheduler
export_tree "$scd_src" .peers/scd lumina1/scheduler
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .peers/whl "transformers==4.47.1" "tokenizers==0.21.0" "huggingface_hub==0.26.5" "absl-py==2.1.0"
du -sh .peers; cat .peers/sjd.commit .peers/scd.commit
