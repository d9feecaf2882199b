"""Queue the example workflow on a local ComfyUI (``POST /prompt``) as baseline and forecast variants.

``python queue_variants.py WORKFLOW.json baseline,taylor,speca [cfg] [seed] [unet_name]``; variants:
``baseline`` (no forecast node), ``baselineN`` (N steps), ``taylor`` / ``taylorN`` (interval N),
``speca`` (the workflow's own node). Adds a SaveLatent node, waits on ``/history`` and prints the
status, execution time, saved image and the stats node's text. Talks to 127.0.0.1:8199 unless
``COMFY_URL`` is set.
"""

import copy
import json
import os
import sys
import time
import urllib.request
import uuid
from pathlib import Path

URL = os.environ.get("COMFY_URL", "http://127.0.0.1:8199")


def call(path: str, data: dict | None = None) -> dict:
    body = None if data is None else json.dumps(data).encode()
    request = urllib.request.Request(URL + path, data=body, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request).read())


def variant(workflow: dict, name: str, cfg: float, seed: int, unet: str | None) -> dict:
    w = copy.deepcopy(workflow)
    tag = f"{name}_cfg{cfg:g}_s{seed}" + ("_" + Path(unet).stem if unet else "")
    w["8"]["inputs"].update(cfg=cfg, seed=seed)
    if unet:
        w["1"]["inputs"]["unet_name"] = unet
    if name.startswith("baseline"):
        if name != "baseline":
            w["8"]["inputs"]["steps"] = int(name[8:])
        w["8"]["inputs"]["model"] = w["9"]["inputs"]["model"] = ["1", 0]
        del w["7"]
    elif name.startswith("taylor"):
        w["7"] = {"class_type": "DiffspecTaylorForecast", "inputs": {
            "model": ["1", 0], "interval": int(name[6:] or 5), "order": 1, "warmup": 3, "last_step_full": True,
            "form": "newton", "abscissa": "sigma"}}
    w["11"]["inputs"]["filename_prefix"] = f"diffspec_{tag}"
    w["13"] = {"class_type": "SaveLatent", "inputs": {"samples": ["9", 0], "filename_prefix": f"latents/diffspec_{tag}"}}
    return w


def queue(prompt: dict, images: str, stats: str) -> dict:
    """Queue ``prompt``, wait for it, and summarise: status, execution seconds, the images of node
    ``images``, the first line of node ``stats``'s text, the error message if any, and the outputs."""
    prompt_id = call("/prompt", {"prompt": prompt, "client_id": str(uuid.uuid4())})["prompt_id"]
    while prompt_id not in (history := call(f"/history/{prompt_id}")):
        time.sleep(1)
    entry = history[prompt_id]
    events = {m[0]: m[1] for m in entry["status"]["messages"]}
    end = events.get("execution_success") or events.get("execution_error") or events["execution_start"]
    outputs = entry["outputs"]
    return {
        "status": entry["status"]["status_str"],
        "exec_s": (end["timestamp"] - events["execution_start"]["timestamp"]) / 1000,
        "images": [i["filename"] for i in outputs.get(images, {}).get("images", [])],
        "stats": outputs.get(stats, {}).get("text", [""])[0].split("\n")[0],
        "error": events.get("execution_error", {}).get("exception_message"),
        "outputs": outputs,
    }


def main() -> None:
    workflow = json.loads(Path(sys.argv[1]).read_text())
    names = sys.argv[2].split(",")
    cfg = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 42
    unet = sys.argv[5] if len(sys.argv) > 5 else None
    for name in names:
        result = queue(variant(workflow, name, cfg, seed, unet), images="11", stats="9")
        result.pop("outputs")
        print(name, json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
