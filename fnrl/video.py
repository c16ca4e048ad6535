"""Write rgb frames to a video file: mp4 through OpenCV, animated GIF through Pillow.

    with VideoWriter("episode.mp4", fps=30) as video:
        for frame in frames:          # [H, W, 3] uint8 RGB
            video.append(frame)

mp4 frames stream to disk as they come; a GIF is written on `close()`.
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
    if path.suffix.lower() == ".mp4":
        try:
            import cv2  # noqa: F401
        except ImportError as e:
            raise ConfigError(f"--record-video {path}: writing mp4 needs OpenCV (opencv-python), which is not "
                              f"installed; record a .gif instead") from e
    return path


class VideoWriter:
    """Collects [H, W, 3] uint8 RGB frames into `path` (.mp4: OpenCV "mp4v"; .gif: Pillow).

    All frames must have the first frame's size. `frames` counts what was written.
    """

    def __init__(self, path: str | Path, fps: float = 30.0):
        self.path = check_video_path(path)
        if fps <= 0:
            raise ConfigError(f"video fps must be positive, got {fps}")
        self.fps = fps
        self.frames = 0
        self._gif: list | None = [] if self.path.suffix.lower() == ".gif" else None
        self._cv = None
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
            import cv2

            if self._cv is None:
                self._tmp = temporary_beside(self.path)
                self._cv = cv2.VideoWriter(str(self._tmp), cv2.VideoWriter_fourcc(*"mp4v"), self.fps,
                                           (frame.shape[1], frame.shape[0]))
                if not self._cv.isOpened():
                    raise ConfigError(f"OpenCV cannot write mp4 on this machine (no mp4v encoder); "
                                      f"record a .gif instead")
            self._cv.write(np.ascontiguousarray(frame[..., ::-1]))  # OpenCV wants BGR
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
        elif self._cv is not None:
            self._cv.release()
            self._cv = None
            os.replace(self._tmp, self.path)
        self._closed = True
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        if kind is None:
            self.close()
        elif self._cv is not None:
            self._cv.release()
            self._tmp.unlink(missing_ok=True)
