"""The checkpoint: one file per run folder, written atomically, read back with one-line errors.

A checkpoint is a dict tagged with `CHECKPOINT_FORMAT`: the algorithm, seed, config, training
state, the loop's counters and RNG states, and what the loop could snapshot of its data (replay
buffer, the graph sampler's envs, the episode statistics). Every loop writes the same payload
through `save_checkpoint`; `load_checkpoint` refuses files of another format or version.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from fnrl.errors import ConfigError
from fnrl.replay import snapshot as replay_snapshot

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "fnrl-checkpoint-v3"
"""v2: PPO/A2C states hold seed, hp and a stored learning rate; v3: DQN/QPG stored rates."""


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint file (or a run folder holding one), with one-line errors."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.exists():
        raise ConfigError(f"no checkpoint at {path}; pass a run folder or its {CHECKPOINT}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or foreign file
        raise ConfigError(f"{path} is not a readable fnrl checkpoint ({type(e).__name__}); it may be corrupt") from e
    tag = ckpt.get("format") if isinstance(ckpt, dict) else None
    if isinstance(tag, str) and tag.startswith("fnrl-checkpoint-") and tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} was written by another fnrl version (format {tag!r}; this one reads "
                          f"{CHECKPOINT_FORMAT!r}); evaluate or resume it with that version, or retrain")
    if tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not an fnrl checkpoint (missing format tag {CHECKPOINT_FORMAT!r})")
    return ckpt


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write atomically: a temporary file in the same folder, then rename over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def checkpoint_payload(*, algo: str, seed: int, config: dict, state, counters: dict, world_size: int = 1,
                       preset: str | None = None, **entries) -> dict:
    """The dict every loop saves: format tag, algorithm, seed, config (as a dict), the state on the
    CPU, the counters, this process's RNG states, and the loop's own `entries` (sampler, replay,
    episode statistics, ...)."""
    return {"format": CHECKPOINT_FORMAT, "algo": algo, "seed": seed, "config": config, "state": state.cpu(),
            "counters": dict(counters), "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
            "world_size": world_size, "preset": preset, **entries}


def config_from_json(d: dict) -> dict:
    """A saved config's fields as `Config(**fields)` takes them (JSON lists back to tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}


def restore_state(fresh, saved, resume):
    """A new run's `init` state `fresh` holding the checkpoint's values `saved` (copied in): the
    resumed run then traces its ahead-of-time models from a state of a new run's key order and
    layout, and finds them in the package cache (an update returns its state in another order);
    ConfigError if the two states do not have the same entries."""
    keys = list(fresh.keys(include_nested=True, leaves_only=True))
    if (set(keys) != set(saved.keys(include_nested=True, leaves_only=True))
            or any(fresh.get(k).shape != saved.get(k).shape or fresh.get(k).dtype != saved.get(k).dtype for k in keys)):
        raise ConfigError(f"the state in checkpoint {resume} does not fit this fnrl version's state of the "
                          "algorithm; resume it with the version that wrote it, or retrain")
    for key in keys:
        fresh.get(key).copy_(saved.get(key))
    return fresh


def replay_to_save(buffer):
    """What a checkpoint holds of the replay: the buffer, if it has one of at most
    `fnrl.replay.snapshot.CHECKPOINT_BYTES`, else None."""
    if buffer is None or replay_snapshot.nbytes(buffer) > replay_snapshot.CHECKPOINT_BYTES:
        return None
    return buffer


def resumed_replay(ckpt: dict, resume, device) -> tuple:
    """(the checkpoint's replay buffer on `device`, or None with a warning that it starts empty; the
    loop's update credit)."""
    saved = ckpt.get("replay")
    if saved is None:
        warnings.warn(f"checkpoint {resume} holds no replay buffer (one over "
                      f"{replay_snapshot.CHECKPOINT_BYTES >> 30} GiB, or from a data-parallel run); "
                      "the resumed run's replay starts empty", stacklevel=3)
        return None, 0.0
    return replay_snapshot.to_device(saved, device), ckpt.get("update_credit", 0.0)
