"""Evaluate a trained policy: greedy / mode actions, full episodes, raw game score."""
from __future__ import annotations

import numpy as np
import torch

from fnrl import algos, envs
from fnrl.train import _from_json, _make_agent, load_checkpoint


def evaluate_state(name: str, config, state, episodes: int = 10, seed: int = 10_000, num_envs: int | None = None,
                   max_steps: int = 1_000_000) -> list[float]:
    """Returns of `episodes` complete episodes of the policy in `state`, without exploration.

    Eval envs are fresh (seed `seed`), with no Atari episodic life or reward clipping.
    Each env contributes its first finished episodes, so short episodes are not favoured.
    Recurrent policies get their carry reset at episode starts, as in the sampler.
    """
    module = algos.load(name)
    n = num_envs or min(episodes, 8)
    env = envs.make(config.env_id, n, seed=seed, train=False)
    agent = _make_agent(module, config, env.spec, compile=False)
    per_env = -(-episodes // n)
    found: list[list[float]] = [[] for _ in range(n)]
    obs = env.reset()["obs"]
    carry = None
    with torch.no_grad():
        for _ in range(max_steps):
            action, _, carry = agent.act(state, obs, carry, False)
            out = env.step(action)
            obs = out["obs"]
            if carry is not None:  # recurrent: a new episode starts after EnvPool's reset step
                carry["reset"] = ~out["valid"]
            for i in torch.nonzero(out["episode_end"]).flatten().tolist():
                if len(found[i]) < per_env:
                    found[i].append(float(out["episode_return"][i]))
            if all(len(f) >= per_env for f in found):
                break
    env.close()
    returns = [r for f in found for r in f][:episodes]
    return returns


def evaluate_checkpoint(path, episodes: int = 10, seed: int = 10_000) -> tuple[str, list[float]]:
    """Load a checkpoint (file or run folder) and evaluate it; returns (algo name, returns)."""
    ckpt = load_checkpoint(path)
    name = ckpt["algo"]
    config = type(algos.default_config(name))(**_from_json(ckpt["config"]))
    return name, evaluate_state(name, config, ckpt["state"], episodes, seed)


def summarize(returns: list[float]) -> str:
    r = np.asarray(returns)
    return f"{len(r)} episodes: return mean {r.mean():.2f} std {r.std():.2f} min {r.min():.2f} max {r.max():.2f}"
