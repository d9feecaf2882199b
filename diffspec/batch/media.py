"""Writing images and videos atomically (temporary file, then ``os.replace``) and reading them back.

A killed run never leaves a half-written output under its final name: at worst a ``.tmp-r<rank>-*``
file, which the next run of that rank removes. Videos are MP4 (H.264 through the ffmpeg binary
of the ``imageio-ffmpeg`` wheel: ``pip install "diffspec[video]"``) or, without it, animated
WebP (lossless) or GIF through Pillow.

Example:
    >>> import numpy as np
    >>> sha = write_image("out/ab/abc.png", np.zeros((8, 8, 3), np.uint8))  # doctest: +SKIP
    >>> read_video("out/cd/cde.mp4").shape  # doctest: +SKIP
    (33, 480, 832, 3)
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

VIDEO_FORMATS = ("mp4", "webp", "gif")


def has_ffmpeg() -> bool:
    """True when the ``imageio-ffmpeg`` wheel (and its ffmpeg binary) is installed."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError):
        return False
    return True


def default_video_format() -> str:
    """``"mp4"`` when ffmpeg is available, else ``"webp"``."""
    return "mp4" if has_ffmpeg() else "webp"


def check_video_format(fmt: str) -> str:
    """``fmt`` if it can be written here.

    Raises:
        ValueError: an unknown format, or ``mp4`` without ``imageio-ffmpeg``.
    """
    if fmt not in VIDEO_FORMATS:
        raise ValueError(f"video format {fmt!r} is not supported: choose one of {', '.join(VIDEO_FORMATS)}")
    if fmt == "mp4" and not has_ffmpeg():
        raise ValueError("video format 'mp4' needs the imageio-ffmpeg wheel: pip install 'diffspec[video]' "
                         "(or use --video-format webp)")
    return fmt


def to_uint8(array: Any) -> np.ndarray:
    """Pipeline output in [0, 1] (numpy, torch or PIL) → ``uint8`` array, channels last."""
    if hasattr(array, "detach"):
        array = array.detach().float().cpu().numpy()
    array = np.asarray(array)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255).round().astype(np.uint8)
    if array.ndim >= 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return array


def output_problem(array: Any) -> str | None:
    """Why a pipeline output is not an image a model makes (None when it is one): NaN or infinite values (a
    diverged sampler), or one value everywhere (an overflow saturating every pixel, a safety checker's blank).

    Example:
        >>> output_problem(np.full((8, 8, 3), np.inf, np.float32))[:46]
        'the output holds 0 NaN and 192 infinite values'
    """
    if hasattr(array, "detach"):
        array = array.detach().float().cpu().numpy()
    data = np.asarray(array)
    if data.dtype.kind in "fc":
        nan, inf = int(np.isnan(data).sum()), int(np.isinf(data).sum())
        if nan or inf:
            return (f"the output holds {nan} NaN and {inf} infinite values of {data.size} (the sampler diverged: "
                    "check guidance_scale, steps, dtype)")
    if data.size > 1 and data.min() == data.max():
        return (f"the output is one value everywhere ({data.flat[0]:g}): a blank, not a generated image (an overflow, "
                "e.g. in float16, or a safety checker)")
    return None


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | Path, write: Callable[[Path], None], *, prefix: str = ".tmp-") -> str:
    """Call ``write(tmp)`` on a temporary file next to ``path``, then move it into place.

    Returns the SHA-256 of what was written. On any error (including a signal turned into an
    exception) the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs get the usual permissions
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        digest = sha256_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest


def write_image(path: str | Path, image: Any, *, prefix: str = ".tmp-") -> str:
    """Write one image (H, W[, C] in [0, 1] or uint8) as PNG, atomically; returns its SHA-256."""
    from PIL import Image

    pil = Image.fromarray(to_uint8(image))
    return write_atomic(path, lambda tmp: pil.save(tmp, format="PNG"), prefix=prefix)


def write_video(path: str | Path, frames: Any, *, fps: int = 16, fmt: str = "mp4", prefix: str = ".tmp-") -> str:
    """Write frames (F, H, W, C) as MP4, animated WebP or GIF (by ``fmt``), atomically; returns its SHA-256."""
    frames = to_uint8(frames)
    if frames.ndim == 3:  # grayscale (F, H, W)
        frames = np.repeat(frames[..., None], 3, axis=-1)
    if fmt == "mp4":
        return write_atomic(path, lambda tmp: _write_mp4(tmp, frames, fps), prefix=prefix)
    if fmt not in ("webp", "gif"):
        raise ValueError(f"video format {fmt!r} is not supported: choose one of {', '.join(VIDEO_FORMATS)}")
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    options: dict[str, Any] = {"lossless": True, "quality": 100} if fmt == "webp" else {}

    def save(tmp: Path) -> None:
        images[0].save(tmp, format=fmt.upper(), save_all=True, append_images=images[1:],
                       duration=max(1, round(1000 / fps)), loop=0, **options)

    return write_atomic(path, save, prefix=prefix)


def _write_mp4(path: Path, frames: np.ndarray, fps: int) -> None:
    import imageio_ffmpeg

    height, width = frames.shape[1:3]
    # H.264 in yuv420p needs even sizes: odd ones are padded up by ffmpeg's scaler (macro block 2)
    writer = imageio_ffmpeg.write_frames(str(path), (width, height), fps=fps, codec="libx264", quality=8,
                                         macro_block_size=2, ffmpeg_log_level="error")
    writer.send(None)
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()


def read_video(path: str | Path) -> np.ndarray:
    """Decode a written video (MP4, WebP, GIF) → ``uint8`` frames (F, H, W, 3).

    Raises:
        ValueError: the file does not decode.
    """
    path = Path(path)
    try:
        if path.suffix == ".mp4":
            import imageio_ffmpeg

            reader = imageio_ffmpeg.read_frames(str(path))
            meta = next(reader)
            width, height = meta["size"]
            frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for buf in reader]
        else:
            from PIL import Image, ImageSequence

            with Image.open(path) as img:
                frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(img)]
    except (OSError, RuntimeError, StopIteration) as exc:
        raise ValueError(f"{path} does not decode as a video: {exc}") from None
    if not frames:
        raise ValueError(f"{path} holds no frame")
    return np.stack(frames)


def clean_temporaries(out: str | Path, prefix: str) -> int:
    """Remove leftovers ``<out>/*/<prefix>*`` of an interrupted run; returns how many."""
    stale = list(Path(out).glob(f"*/{prefix}*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)
