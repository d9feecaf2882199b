#!/usr/bin/env bash
# GPU measurements still owed by issues 4, 6, 7, 8 and 9, in stages that each fit one 10-minute
# command of the device tool (run from the repository root there; results land in $OUT).
#
#   here:   bash scripts/gpu/fetch_wheels.sh          # diffusers, cache-dit, importlib_metadata -> .whl/
#   device: run(command="bash scripts/gpu/session.sh kernels", carry=[".whl"], timeout_s=600)
#
# Stages, in the order to run them when device time is short (30 min per session, starts included):
#   kernels  issue 9: GPU kernel tests, `bench kernels` (GB/s vs copy bandwidth, vs torch/compile/FlashInfer),
#            `bench kernels --methods outside-model` (share of decode time outside the models)      ~5 min
#   exact    issue 6: exact-diffusion on random-weight DiT-XL/2-256, batch 1, 100 and 250 steps,
#            CUDA graphs (reduce-overhead) for both arms, then eager                                 ~5-9 min
#   flux     issue 4: dit-cache on FLUX-size 1024^2, 50 steps, regional compile then eager           ~6-7 min
#   mm       issue 8: multimodal-cost (7B-size VLM LMs, 1k-32k visual tokens, batch 1-8; e2e block)  ~7 min
#   ar       issue 7: ar-image-cost (LlamaGen-XL and a 7B-size config, 256/576 tokens, batch 1-8)    ~2-4 min
#   ar-ra    issue 7: the same calls costed for the tree methods (mc-sjd-ra, sjd-pac: K = their tree's
#            tokens per call) with the acceptance of ar-image-tiny-ar-noisy-cpu-ra.json               ~2-4 min
# Every estimate is unmeasured (no GPU was lent when this was written): read the log's timings and split a
# stage (its commands are independent) if one comes near the limit. Copy the JSON files that come back into
# benchmarks/results/ and cite them.
set -uo pipefail
stage="${1:?usage: session.sh kernels|exact|flux|mm|ar|ar-ra}"
OUT="${OUT:-/tmp/diffspec-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="$PWD:/tmp/site"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
log="$OUT/$stage.log"
ds() { python3 -m diffspec "$@"; }
{
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA')"
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv || true
  case "$stage" in
    kernels)
      timeout 150 python3 -m pytest -q -m gpu tests/kernels -x -p no:cacheprovider
      timeout 200 python3 -m diffspec bench kernels --device cuda --out "$OUT/kernels-h100.json"
      timeout 200 python3 -m diffspec bench kernels --device cuda --methods outside-model \
        --out "$OUT/kernels-outside-model-h100.json"
      ;;
    exact)
      timeout 380 python3 -m diffspec bench exact-diffusion --model dit-xl-2-256 --device cuda --dtype bfloat16 \
        --batch-size 1 --steps 100,250 --quality-steps 100 --quality-samples 2 --methods coupling --repeats 3 \
        --warmup 1 --set max_lookahead=8 --compile reduce-overhead --out "$OUT/exact-diffusion-dit-xl-2-256-h100-graphs.json"
      timeout 200 python3 -m diffspec bench exact-diffusion --model dit-xl-2-256 --device cuda --dtype bfloat16 \
        --batch-size 1 --steps 100,250 --quality-steps 100 --quality-samples 2 --methods coupling --repeats 2 \
        --warmup 1 --set max_lookahead=8 --compile none --out "$OUT/exact-diffusion-dit-xl-2-256-h100-eager.json"
      ;;
    flux)
      timeout 330 python3 -m diffspec bench dit-cache --model flux-1024 --device cuda --steps 50 \
        --methods taylor,speca,diffusers-taylorseer --repeats 2 --warmup 1 --compile repeated-blocks \
        --out "$OUT/dit-cache-flux-1024-h100-compiled.json"
      timeout 240 python3 -m diffspec bench dit-cache --model flux-1024 --device cuda --steps 50 \
        --methods taylor,speca,diffusers-taylorseer --repeats 2 --warmup 1 --compile none \
        --out "$OUT/dit-cache-flux-1024-h100-eager.json"
      ;;
    mm)
      timeout 570 python3 -m diffspec bench multimodal-cost --device cuda --repeats 5 --warmup 2 \
        --set time_budget_s=420 --set "checkpoint=$OUT/multimodal-cost-h100.partial.json" \
        --out "$OUT/multimodal-cost-h100.json"
      ;;
    ar)
      timeout 570 python3 -m diffspec bench ar-image-cost --model llamagen-xl,llamagen-7b-size --device cuda \
        --repeats 30 --warmup 5 --out "$OUT/ar-image-cost-h100.json"
      ;;
    ar-ra)
      timeout 570 python3 -m diffspec bench ar-image-cost --model llamagen-xl,llamagen-7b-size --device cuda \
        --methods call --set acceptance_json=benchmarks/results/ar-image-tiny-ar-noisy-cpu-ra.json \
        --repeats 30 --warmup 5 --out "$OUT/ar-image-cost-h100-ra.json"
      ;;
    *) echo "unknown stage $stage: kernels|exact|flux|mm|ar|ar-ra"; exit 2 ;;
  esac
} 2>&1 | tee "$log"
