"""ComfyUI custom-node entry point: this repository is itself the node folder.

``git clone`` (or symlink) the repository into ``ComfyUI/custom_nodes/``, or install it from the
Comfy registry. ComfyUI imports this file (under a path-derived module name) and reads
``NODE_CLASS_MAPPINGS`` / ``NODE_DISPLAY_NAME_MAPPINGS``.

The ``diffspec`` package next to this file is loaded as ``diffspec`` without touching ``sys.path``,
so the nodes always run the code they ship with and nothing needs installing: the node pack uses
only torch (and tqdm), which ComfyUI has. If ``diffspec`` was already imported in the process (for
example installed with ``pip install -e .`` into ComfyUI's Python and imported by another node),
that one is used.
"""

import importlib.util
import os
import sys


def _load_diffspec() -> None:
    if "diffspec" in sys.modules:
        return
    package_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "diffspec")
    init = os.path.join(package_dir, "__init__.py")
    if not os.path.isfile(init):  # not a full checkout: fall back to an installed diffspec
        return
    spec = importlib.util.spec_from_file_location("diffspec", init, submodule_search_locations=[package_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules["diffspec"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["diffspec"]
        raise


_load_diffspec()

from diffspec.comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
