"""Write rgb frames to a video file: H.264 mp4 through imageio-ffmpeg, animated GIF through Pillow.

    with VideoWriter("episode.mp4", fps=30) as video:
        for frame in frames:          # [H, W, 3] uint8 RGB
            video.append(frame)

mp4 frames stream to an ffmpeg process as they come (H.264, yuv420p: what browsers play; frames
of odd size get an edge row / column repeated); a GIF is written on `close()`. mp4 needs the
`video` extra (imageio-ffmpeg, which brings its own ffmpeg binary). `preview_gif` makes a small
animated GIF of a written video, the form TensorBoard's image dashboard plays.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from fnrl.errors import ConfigError
from fnrl.files import replacing, temporary_beside

FORMATS = (".mp4", ".gif")


def check_video_path(path: str | Path) -> Path:
    """Raise a one-line ConfigError for a path that cannot take a video (before any work)."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"--record-video {path}: use a file name ending in .mp4 or .gif")
    if not path.resolve().parent.is_dir():
        raise ConfigError(f"--record-video {path}: folder {path.resolve().parent} does not exist")
    if path.suffix.lower() == ".mp4" and not mp4_available():
        raise ConfigError(f"--record-video {path}: writing mp4 needs imageio-ffmpeg (pip install \"fnrl[video]\"), "
                          "which is not installed; record a .gif instead")
    return path


def mp4_available() -> bool:
    """Whether mp4 files can be written here (imageio-ffmpeg is installed)."""
    import importlib.util

    return importlib.util.find_spec("imageio_ffmpeg") is not None


class VideoWriter:
    """Collects [H, W, 3] uint8 RGB frames into `path` (.mp4: H.264 through imageio-ffmpeg; .gif: Pillow).

    All frames must have the first frame's size. `frames` counts what was written.
    """

    def __init__(self, path: str | Path, fps: float = 30.0):
        self.path = check_video_path(path)
        if fps <= 0:
            raise ConfigError(f"video fps must be positive, got {fps}")
        self.fps = fps
        self.frames = 0
        self._gif: list | None = [] if self.path.suffix.lower() == ".gif" else None
        self._mp4 = None   # the ffmpeg writer (a generator taking frames)
        self._size = None
        self._closed = False

    def append(self, frame) -> None:
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ConfigError(f"video frames must be [H, W, 3] uint8 RGB, got {frame.dtype} {frame.shape}")
        if self._size is None:
            self._size = frame.shape
        elif frame.shape != self._size:
            raise ConfigError(f"video frame size changed from {self._size} to {frame.shape}")
        if self._gif is not None:
            from PIL import Image

            self._gif.append(Image.fromarray(frame))
        else:
            even = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), mode="edge")
            if self._mp4 is None:
                import imageio_ffmpeg

                self._tmp = temporary_beside(self.path)
                self._mp4 = imageio_ffmpeg.write_frames(
                    str(self._tmp), (even.shape[1], even.shape[0]), fps=self.fps, codec="libx264",
                    pix_fmt_in="rgb24", pix_fmt_out="yuv420p", macro_block_size=1, ffmpeg_log_level="error")
                self._mp4.send(None)   # starts ffmpeg
            self._mp4.send(np.ascontiguousarray(even))
        self.frames += 1

    def close(self) -> Path:
        """Finish the file (written atomically: a temporary file, then a rename)."""
        if self._closed:
            return self.path
        if self.frames == 0:
            raise ConfigError(f"no frames were recorded for {self.path}")
        if self._gif is not None:
            with replacing(self.path) as tmp:
                self._gif[0].save(tmp, save_all=True, append_images=self._gif[1:], duration=round(1000 / self.fps),
                                  loop=0)
            self._gif = []
        elif self._mp4 is not None:
            self._mp4.close()   # ffmpeg finishes the file
            self._mp4 = None
            os.replace(self._tmp, self.path)
        self._closed = True
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
        elif self._mp4 is not None:
            self._mp4.close()
            self._tmp.unlink(missing_ok=True)


def read_frames(path: str | Path):
    """The [H, W, 3] uint8 RGB frames of a video that `VideoWriter` wrote (.mp4 or .gif), one at a time."""
    path = Path(path)
    if path.suffix.lower() == ".gif":
        from PIL import Image, ImageSequence

        with Image.open(path) as image:
            for frame in ImageSequence.Iterator(image):
                yield np.asarray(frame.convert("RGB"))
        return
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    width, height = next(reader)["size"]
    for data in reader:
        yield np.frombuffer(data, np.uint8).reshape(height, width, 3)


def _frame_count(path: Path) -> int:
    """The frames in a video (at least 1): Pillow's count for a GIF, ffmpeg's for an mp4."""
    if Path(path).suffix.lower() == ".gif":
        from PIL import Image

        with Image.open(path) as image:
            return max(1, image.n_frames)
    import imageio_ffmpeg

    return max(1, imageio_ffmpeg.count_frames_and_secs(str(path))[0])


def preview_gif(path: str | Path, max_side: int = 160, max_frames: int = 250) -> tuple[bytes, int, int]:
    """(GIF bytes, height, width): the video at `path`, shrunk by an integer stride to at most
    `max_side` pixels a side and to at most `max_frames` frames (every k-th frame, played k times
    slower, so the preview lasts as long as the video)."""
    import io

    from PIL import Image

    every = -(-_frame_count(path) // max_frames)
    small = []
    for i, frame in enumerate(read_frames(path)):   # one full-size frame in memory at a time
        if i % every == 0:
            stride = -(-max(frame.shape[:2]) // max_side)
            small.append(Image.fromarray(np.ascontiguousarray(frame[::stride, ::stride])))
    if not small:
        raise ConfigError(f"{path} holds no frames")
    out = io.BytesIO()
    small[0].save(out, format="GIF", save_all=True, append_images=small[1:], duration=round(1000 * every / 30), loop=0)
    return out.getvalue(), small[0].height, small[0].width
