#!/usr/bin/env bash
# GPU measurements, in stages that each fit one 10-minute command (run from the repository root on a CUDA machine
# with `.whl/` next to it; results land in $OUT, named after the GPU).
#
#   with network:  bash scripts/gpu/fetch_wheels.sh           # diffusers, cache-dit -> .whl/
#   on the GPU:    bash scripts/gpu/stages.sh kernels         # or several stages: stages.sh ar-graphs ar-official
#                  (ar-official also needs .peers/ from scripts/gpu/fetch_peers.sh)
#
# Stages, most decisive first:
#   kernels  GPU kernel tests, `bench kernels` (GB/s vs copy bandwidth, vs torch/compile/FlashInfer),
#            `bench kernels --methods outside-model` (share of decode time outside the models)      ~5 min
#   exact    exact-diffusion on random-weight DiT-XL/2-256, batch 1, 100 and 250 steps,
#            eager (~1.5 min on an H100), then CUDA graphs (reduce-overhead) for both arms           ~5-8 min
#   flux     dit-cache on FLUX-size 1024^2, 50 steps, regional compile then eager           ~6-7 min
#   mm       multimodal-cost (7B-size VLM LMs, 1k-32k visual tokens, batch 1-8; e2e block)  ~7 min
#   ar       ar-image-cost (LlamaGen-XL and a 7B-size config, 256/576 tokens, batch 1-8)    ~2-4 min
#   ar-ra    the same calls costed for the tree methods (mc-sjd-ra, sjd-pac: K = their tree's
#            tokens per call) with the acceptance of ar-image-tiny-ar-noisy-cpu-ra.json               ~3 min
#   dit-more dit-cache with every peer on flux-1024 (28 steps), pixart-1024, dit-xl-2-256 and the
#            Wan 2.1 1.3B config at 512^2 x 17 frames, eager                                           ~7 min
#   replay   speca replaying tiny-dit's calibrated full-step schedule (10 and 17 full steps) on
#            the real-size configs (scripts/gpu/dit_cache_replay.py)                                   ~4 min
#   ar-prof  torch.profiler of mc-sjd rounds on llamagen-7b-size (scripts/gpu/profile_mcsjd_round.py) ~1 min
#   ar-graphs ar-image-cost with every target call replayed from CUDA graphs (GraphedStep: the eager
#            calls are launch-bound), after the GraphedStep GPU tests                                     ~5 min
#   dit-graphs dit-cache on dit-xl-2-256 and pixart-1024 with --compile reduce-overhead (CUDA graphs) for
#            every arm: checks that graph replays leave the forecast hooks' anchors intact (PSNR as eager)  ~4 min
#   dit-prof torch.profiler of whole dit-cache runs per arm on dit-xl-2-256 and pixart-1024 (launches,
#            host syncs, GPU time: why a forecast step costs 3-9 ms there) (scripts/gpu/profile_dit_step.py) ~2 min
#   flux-fixed the per-image costs a FLUX pipeline adds around the loop (T5-XXL, CLIP-L, VAE decode at
#            1024², random weights) and the end-to-end speedups they leave of the loop's (run after `flux`
#            on the same GPU kind, or with its committed JSON) (scripts/gpu/flux_fixed_costs.py)     ~1-2 min
#   dit-equal dit-cache at equal full evaluations (--budget-evals 13,20, every arm's knobs searched) on
#            dit-xl-2-256 and pixart-1024, 50 steps; speca-replay replays the trained tiny-dit's calibration  ~8-9 min
#   ar-official the official SJD / SCD code against diffspec's sjd / mc-sjd at equal window on tiny-ar, on
#            the GPU (needs .peers: `bash scripts/gpu/fetch_peers.sh` here, then carry=[".peers"])      ~2-4 min
#   train-dit  two tiny-dit candidates trained from scratch side by side (batch 256, min-SNR 5, cosine in 7
#            minutes): 1x1 latent patches (16x16 tokens, 5 blocks, 96 wide, the shipped weights' size) and
#            6 blocks 128 wide (2x2 patches, 2.9 M parameters: int8 when shipped); each scored on 1000 samples  ~9 min
#   train-flux a scene VAE (1500 CPU steps), then tiny-flux trained on its latents on the GPU (batch 256, 6 minutes),
#            scored on 1000 held-out prompts by the scene judge                                               ~9 min
#   flux-cn  dit-cache on FLUX-size 1024^2 (28 steps) with a 5 + 10 block FLUX ControlNet called every step:
#            taylor forecasting the ControlNet's outputs vs the ControlNet every step vs diffusers' TaylorSeer  ~5 min
# Measured on an H200 (2026-11-25): ar ~5.5 min, ar-ra ~3 min, flux ~4.5 min (both parts), a machine start
# ~1.5 min; on an H100 (2026-11-27): kernels ~2 min, a machine start under 1 min. Outputs are named after the GPU (h100, h200). Copy the JSON files that come back into
# benchmarks/results/ and cite them.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: stages.sh STAGE [STAGE...]: kernels|exact|flux|mm|ar|ar-ra|dit-more|replay|ar-prof|ar-graphs|dit-graphs|dit-equal|dit-prof|flux-fixed|ar-official|train-dit|train-flux"; exit 2; }
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
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'; \
print(next((k for k in ('h100', 'h200', 'a100', 'l40s') if k in n.lower()), 'gpu'))")
ds() { python3 -m diffspec "$@"; }
status=0
for stage in "$@"; do  # several stages in one call save machine starts; each keeps its own log
log="$OUT/$stage.log"
{
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA')"
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv || true
  case "$stage" in
    kernels)
      timeout 150 python3 -m pytest -q -m gpu tests/kernels -x -p no:cacheprovider
      timeout 200 python3 -m diffspec bench kernels --device cuda --out "$OUT/kernels-$gpu.json"
      timeout 200 python3 -m diffspec bench kernels --device cuda --methods outside-model \
        --out "$OUT/kernels-outside-model-$gpu.json"
      ;;
    exact)  # eager first (about a minute), then both arms CUDA-graph captured (compiles 6 row buckets)
      timeout 150 python3 -m diffspec bench exact-diffusion --model dit-xl-2-256 --device cuda --dtype bfloat16 \
        --batch-size 1 --steps 100,250 --quality-steps 100 --quality-samples 2 --methods coupling --repeats 2 \
        --warmup 1 --set max_lookahead=8 --compile none --out "$OUT/exact-diffusion-dit-xl-2-256-$gpu-eager.json"
      timeout 360 python3 -m diffspec bench exact-diffusion --model dit-xl-2-256 --device cuda --dtype bfloat16 \
        --batch-size 1 --steps 100,250 --quality-steps 100 --quality-samples 2 --methods coupling --repeats 3 \
        --warmup 1 --set max_lookahead=8 --compile reduce-overhead --out "$OUT/exact-diffusion-dit-xl-2-256-$gpu-graphs.json"
      ;;
    flux)
      timeout 330 python3 -m diffspec bench dit-cache --model flux-1024 --device cuda --steps 50 \
        --methods taylor,speca,diffusers-taylorseer --repeats 2 --warmup 1 --compile repeated-blocks \
        --out "$OUT/dit-cache-flux-1024-$gpu-compiled.json"
      timeout 240 python3 -m diffspec bench dit-cache --model flux-1024 --device cuda --steps 50 \
        --methods taylor,speca,diffusers-taylorseer --repeats 2 --warmup 1 --compile none \
        --out "$OUT/dit-cache-flux-1024-$gpu-eager.json"
      ;;
    flux-cn)
      timeout 420 python3 -m diffspec bench dit-cache --model flux-1024-controlnet --device cuda --steps 28 \
        --methods taylor,taylor-controlnet-every-step,speca,diffusers-taylorseer,fewer-steps --repeats 2 \
        --warmup 1 --out "$OUT/dit-cache-flux-1024-controlnet-$gpu.json"
      ;;
    mm)
      timeout 570 python3 -m diffspec bench multimodal-cost --device cuda --repeats 5 --warmup 2 \
        --set time_budget_s=420 --set "checkpoint=$OUT/multimodal-cost-$gpu.partial.json" \
        --out "$OUT/multimodal-cost-$gpu.json"
      ;;
    ar)
      timeout 570 python3 -m diffspec bench ar-image-cost --model llamagen-xl,llamagen-7b-size --device cuda \
        --repeats 30 --warmup 5 --out "$OUT/ar-image-cost-$gpu.json"
      ;;
    ar-ra)
      timeout 570 python3 -m diffspec bench ar-image-cost --model llamagen-xl,llamagen-7b-size --device cuda \
        --methods call --set acceptance_json=benchmarks/results/ar-image-tiny-ar-noisy-cpu-ra.json \
        --repeats 30 --warmup 5 --out "$OUT/ar-image-cost-$gpu-ra.json"
      ;;
    dit-more)
      all=taylor,speca,diffusers-taylorseer,diffusers-taylorseer-tuned,diffusers-fbc,diffusers-magcache
      all=$all,cache-dit-dbcache,cache-dit-dbcache-taylorseer,fewer-steps
      timeout 230 python3 -m diffspec bench dit-cache --model flux-1024 --device cuda --steps 28 --methods $all \
        --repeats 2 --warmup 1 --out "$OUT/dit-cache-flux-1024-28-$gpu-eager.json"
      for m in pixart-1024 dit-xl-2-256 wan-1.3b-512-17f; do
        timeout 150 python3 -m diffspec bench dit-cache --model $m --device cuda --steps 50 --methods $all \
          --repeats 2 --warmup 1 --out "$OUT/dit-cache-$m-$gpu-eager.json"
      done
      ;;
    replay)
      timeout 240 python3 scripts/gpu/dit_cache_replay.py --model flux-1024 --full 10,17 --out "$OUT"
      for m in pixart-1024 dit-xl-2-256 wan-1.3b-512-17f; do
        timeout 100 python3 scripts/gpu/dit_cache_replay.py --model $m --full 10 --out "$OUT"
      done
      ;;
    ar-prof)
      timeout 150 python3 scripts/gpu/profile_mcsjd_round.py --out "$OUT"
      ;;
    ar-graphs)
      timeout 120 python3 -m pytest -q -m gpu tests/ar_image/test_cuda_graph.py -p no:cacheprovider || echo "GPU tests of the graph paths FAILED (the suite runs anyway)"
      timeout 460 python3 -m diffspec bench ar-image-cost --model llamagen-xl,llamagen-7b-size --device cuda \
        --set graphs=true --repeats 30 --warmup 5 --out "$OUT/ar-image-cost-$gpu-graphs.json"
      ;;
    dit-graphs)
      for m in dit-xl-2-256 pixart-1024; do
        timeout 230 python3 -m diffspec bench dit-cache --model $m --device cuda --steps 50 \
          --methods taylor,speca,diffusers-magcache,fewer-steps --repeats 3 --warmup 1 --compile reduce-overhead \
          --out "$OUT/dit-cache-$m-$gpu-graphs.json"
      done
      ;;
    dit-equal)
      timeout 240 python3 -m diffspec bench dit-cache --model dit-xl-2-256 --device cuda --steps 50 \
        --budget-evals 13,20 --repeats 2 --warmup 1 --out "$OUT/dit-cache-dit-xl-2-256-$gpu-equal-evals.json"
      timeout 320 python3 -m diffspec bench dit-cache --model pixart-1024 --device cuda --steps 50 \
        --budget-evals 13,20 --repeats 2 --warmup 1 --out "$OUT/dit-cache-pixart-1024-$gpu-equal-evals.json"
      ;;
    dit-prof)
      for m in dit-xl-2-256 pixart-1024; do
        timeout 150 python3 scripts/gpu/profile_dit_step.py --model $m --out "$OUT"
      done
      ;;
    flux-fixed)
      loop=""
      for f in "$OUT/dit-cache-flux-1024-$gpu-eager.json" "benchmarks/results/dit-cache-flux-1024-$gpu-eager.json"; do
        [ -f "$f" ] && { loop="--loop-json $f"; break; }
      done
      timeout 300 python3 scripts/gpu/flux_fixed_costs.py $loop --out "$OUT"
      ;;
    train-dit)
      # the same size plateaus near 0.6 class accuracy on a CPU whatever the objective: more compute per image
      dit="scripts/train_tiny_dit.py --vae diffspec/weights/tiny-dit/vae --lr 5e-4 --warmup 500 --schedule cosine \
        --steps 200000 --minutes 7 --batch-size 256 --min-snr 5 --device cuda --threads 6 --eval-samples 1000"
      timeout 580 python3 $dit --layers 5 --patch-size 1 --out "$OUT/tiny-dit-p1" --record "$OUT/tiny_dit_p1-$gpu.json" &
      p1=$!
      timeout 580 python3 $dit --layers 6 --head-dim 32 --out "$OUT/tiny-dit-w128" --record "$OUT/tiny_dit_w128-$gpu.json" &
      p2=$!
      wait $p1; r1=$?; wait $p2; r2=$?  # the stage fails when either run does
      [ "$r1" -eq 0 ] && [ "$r2" -eq 0 ]
      ;;
    train-flux)
      timeout 150 python3 scripts/train_tiny_vae.py --data scenes --out "$OUT/scene-vae" --record "$OUT/scene_vae-$gpu.json"
      timeout 420 python3 scripts/train_tiny_flux.py --vae "$OUT/scene-vae" --minutes 5 --batch-size 256 --device cuda \
        --threads 8 --out "$OUT/tiny-flux" --record "$OUT/tiny_flux-$gpu.json"
      ;;
    ar-official)
      [ -d .peers/sjd ] || { echo "no .peers: run scripts/gpu/fetch_peers.sh here and carry .peers"; exit 2; }
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peersite \
        .peers/whl/*.whl || { echo "peer wheel install failed"; exit 1; }
      timeout 540 python3 scripts/ar_image_official_peers.py --device cuda --sjd-repo .peers/sjd --scd-repo .peers/scd \
        --sjd-commit "$(cat .peers/sjd.commit)" --scd-commit "$(cat .peers/scd.commit)" --peer-site /tmp/peersite \
        --windows 8,16,32 --diffspec-windows 64 --images 32 --warmup 2 \
        --out "$OUT/ar-image-tiny-ar-$gpu-official-peers.json"
      ;;
    *) echo "unknown stage $stage: kernels|exact|flux|mm|ar|ar-ra|dit-more|replay|ar-prof|ar-graphs|dit-graphs|dit-equal|dit-prof|flux-fixed|ar-official|train-dit|train-flux"; exit 2 ;;
  esac
} 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "stage $stage exited $rc"; status=$rc; }
done
exit $status
