"""The checkpoint: one file per run folder, written atomically, read back with one-line errors.

A checkpoint is a dict tagged with `CHECKPOINT_FORMAT`: the algorithm, seed, config, training
state, the loop's counters and RNG states, and what the loop could snapshot of its data (replay
buffer, the graph sampler's envs, the episode statistics). Every loop writes the same payload
through `save_checkpoint`; `load_checkpoint` refuses files of another format or version.

Reading a checkpoint runs no code from it: it is written as plain data (`fnrl.run.plain`) and
read with `torch.load(weights_only=True)`, which refuses any other object in the file before
building it. Writes are atomic and durable: a temporary file of a unique name in the same
folder, flushed to disk, renamed over the old checkpoint, the folder flushed too; a failed
write leaves the old checkpoint and no temporary file.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDictBase

from fnrl.errors import ConfigError
from fnrl.replay import snapshot as replay_snapshot
from fnrl.run.plain import from_plain, to_plain

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "fnrl-checkpoint-v4"
"""v2: PPO/A2C states hold seed, hp and a stored learning rate; v3: DQN/QPG stored rates;
v4: plain data, read with weights_only=True (`fnrl.run.plain`)."""


REQUIRED = {"algo": str, "seed": int, "config": dict, "state": TensorDictBase, "counters": dict}
"""The entries every checkpoint has, with their types (`load_checkpoint` checks them)."""

POLICY_FORMAT = "fnrl-policy-v1"
"""A policy file (`fnrl export`): what acting needs of a trained state, for sharing an agent."""

POLICY_REQUIRED = {"algo": str, "config_json": str, "state": TensorDictBase}
"""The entries of a policy file: the algorithm, its Config as JSON, and the state `act` reads."""


def load_checkpoint(path: str | Path, policy: bool = False) -> dict:
    """Read a checkpoint file (or a run folder holding one), with one-line errors; with `policy`, a
    policy file (`POLICY_FORMAT`, see `policy_payload`) is read too, its config back as a dict."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.exists():
        raise ConfigError(f"no checkpoint at {path}; pass a run folder or its {CHECKPOINT}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:   # an object weights_only refuses to build
        raise ConfigError(f"{path} was not opened: it holds objects that loading would have to run code for "
                          f"(a file from an fnrl older than {CHECKPOINT_FORMAT!r}, or a crafted one); "
                          "retrain, or evaluate it with the fnrl version that wrote it") from e
    except Exception as e:  # truncated or foreign file
        raise ConfigError(f"{path} is not a readable fnrl checkpoint ({type(e).__name__}); it may be corrupt") from e
    tag = ckpt.get("format") if isinstance(ckpt, dict) else None
    if tag == POLICY_FORMAT:
        if policy:
            return _policy(ckpt, path)
        raise ConfigError(f"{path} is a policy file (`fnrl export`): `fnrl eval` takes it, but resuming a run "
                          f"needs the run's {CHECKPOINT}")
    if isinstance(tag, str) and tag.startswith("fnrl-checkpoint-") and tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} was written by another fnrl version (format {tag!r}; this one reads "
                          f"{CHECKPOINT_FORMAT!r}); evaluate or resume it with that version, or retrain")
    if tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not an fnrl checkpoint (missing format tag {CHECKPOINT_FORMAT!r})")
    try:
        ckpt = from_plain(ckpt)
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{path} is not a readable fnrl checkpoint ({e})") from e
    for key, kind in REQUIRED.items():
        if not isinstance(ckpt.get(key), kind):
            problem = "has no" if key not in ckpt else "has a malformed"
            raise ConfigError(f"{path} {problem} {key!r} entry, so it is not a whole fnrl checkpoint; resume or "
                              "evaluate another one, or retrain")
    return ckpt


def _policy(saved: dict, path: Path) -> dict:
    try:
        saved = from_plain(saved)
        for key, kind in POLICY_REQUIRED.items():
            if not isinstance(saved.get(key), kind):
                raise ValueError(f"no {key!r} entry")
        return {**saved, "config": json.loads(saved["config_json"])}
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{path} is not a readable fnrl policy file ({e})") from e


def policy_payload(algo: str, config: dict, state, act_keys) -> dict:
    """A policy file's contents: the algorithm, its Config as JSON, and of the trained `state` (one
    run's, on the CPU) the entries `act` reads (`act_keys`; None: all but optimizer moments and
    target networks). Written with `save_checkpoint`, read with `load_checkpoint(path, policy=True)`:
    no code runs when it is opened, and `fnrl eval` takes it as it takes a checkpoint."""
    kept = state.select(*act_keys, strict=False) if act_keys is not None else state.exclude("opt_state", "target")
    return {"format": POLICY_FORMAT, "algo": algo, "config_json": json.dumps(config, default=list),
            "state": kept.cpu()}


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write `payload` as plain data (TypeError, before any file is touched, for a value that is
    not), atomically and durably (module docstring)."""
    plain = to_plain(payload)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(plain, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk, where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
