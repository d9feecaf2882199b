"""Queue the speculative-sampler workflow on a local ComfyUI as plain and speculative variants.

``python queue_sampler_variants.py WORKFLOW.json plain,spec1,spec4 [steps] [seed] [batch]``; variants:
``plain`` (ComfyUI's own ``KSamplerSelect`` sampler of the same name instead of the diffspec node),
``specN`` (the diffspec node with lookahead N; ``spec1`` has adaptive off, i.e. the plain sampler's
path through the node). Saves each latent (SaveLatent) and prints status, execution time, the stats
line and the latent file. Talks to 127.0.0.1:8199 unless ``COMFY_URL`` is set.
"""

import copy
import json
import sys
from pathlib import Path

from queue_variants import queue  # the same folder


def variant(workflow: dict, name: str, steps: int, seed: int, batch: int) -> dict:
    w = copy.deepcopy(workflow)
    tag = f"{name}_n{steps}_s{seed}_b{batch}"
    w["8"]["inputs"]["steps"] = steps
    w["9"]["inputs"]["noise_seed"] = seed
    w["6"]["inputs"]["batch_size"] = batch
    if name == "plain":
        w["7"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": w["7"]["inputs"]["sampler"]}}
        w["11"]["inputs"]["samples"] = ["9", 0]
        del w["10"], w["13"]
    else:
        lookahead = int(name[4:])
        w["7"]["inputs"].update(lookahead=lookahead, adaptive=lookahead > 1)
    w["12"]["inputs"]["filename_prefix"] = f"diffspec_{tag}"
    w["14"] = {"class_type": "SaveLatent", "inputs": {"samples": ["9", 0], "filename_prefix": f"latents/diffspec_{tag}"}}
    return w


def main() -> None:
    workflow = json.loads(Path(sys.argv[1]).read_text())
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 42
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    for name in sys.argv[2].split(","):
        result = queue(variant(workflow, name, steps, seed, batch), images="12", stats="10")
        result["latent"] = [i["filename"] for i in result.pop("outputs").get("14", {}).get("latents", [])]
        print(name, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
