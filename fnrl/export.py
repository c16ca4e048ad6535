"""`fnrl export RUN`: a trained agent as a policy file to share.

    path = export_policy("runs/ppo-CartPole-v1-s0")        # -> runs/ppo-CartPole-v1-s0/policy.pt
    name, returns = fnrl.evaluate.evaluate_checkpoint(path)  # `fnrl eval policy.pt` alike

A policy file holds the algorithm, its Config as JSON and, of the trained state, only what
acting reads (parameters, observation normalizers; every vmapped row of a --num-seeds run): no
optimizer moments, target networks, replay or RNG states. It is plain data, read without running
code from it (`fnrl.run.checkpoint.policy_payload`), and a fraction of the checkpoint's size.
"""
from __future__ import annotations

from pathlib import Path

from fnrl import algos
from fnrl.errors import ConfigError
from fnrl.run.checkpoint import CHECKPOINT, load_checkpoint, policy_payload, save_checkpoint

POLICY = "policy.pt"
"""The policy file's default name, in the run folder."""


def export_policy(run, out=None) -> Path:
    """Write the policy file of the run folder (or checkpoint) `run` to `out` (default:
    `POLICY` beside the checkpoint); returns its path."""
    ckpt = load_checkpoint(run)
    folder = Path(run) if Path(run).is_dir() else Path(run).parent
    out = Path(out) if out is not None else folder / POLICY
    if out.name == CHECKPOINT and out.parent.resolve() == folder.resolve():
        raise ConfigError(f"--out {out} would overwrite the run's checkpoint; choose another file")
    if not out.parent.is_dir():
        raise ConfigError(f"the folder of --out {out} does not exist; create it or choose another path")
    module = algos.load(ckpt["algo"])
    save_checkpoint(out, policy_payload(ckpt["algo"], ckpt["config"], ckpt["state"], module.SPEC.act_keys))
    return out
