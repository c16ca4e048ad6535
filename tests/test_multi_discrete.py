"""MultiDiscrete and MultiBinary actions: independent categoricals over the parts of an action
(`fnrl.distributions.multi_categorical_*`), for the actor-critic algorithms."""
from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fnrl import distributions as D
from fnrl import envs
from fnrl.errors import ConfigError
from fnrl.presets import configure
from fnrl.train import train
from tests.learning import final_evaluations


class Match(gym.Env):
    """Each step shows a random target per part (one-hot); the reward is the number of parts the
    action matches. 10 steps an episode: a perfect policy returns 10 x K."""

    def __init__(self, nvec=(3, 2), binary: bool = False):
        self.nvec = (2,) * len(nvec) if binary else tuple(nvec)
        self.action_space = gym.spaces.MultiBinary(len(nvec)) if binary else gym.spaces.MultiDiscrete(list(nvec))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (sum(self.nvec),), np.float32)

    def _show(self):
        self.target = [int(self.np_random.integers(n)) for n in self.nvec]
        obs = np.zeros(sum(self.nvec), np.float32)
        obs[np.cumsum((0,) + self.nvec[:-1]) + np.array(self.target)] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._show(), {}

    def step(self, action):
        reward = float(sum(int(a) == t for a, t in zip(action, self.target)))
        self.t += 1
        return self._show(), reward, False, self.t == 10, {}


for _name, _kwargs in {"fnrl-test/Match-v0": {}, "fnrl-test/MatchBits-v0": {"nvec": (2, 2, 2), "binary": True}}.items():
    if _name not in gym.registry:
        gym.register(_name, entry_point=Match, kwargs=_kwargs)


def test_multi_categorical_equals_a_loop_over_independent_categoricals():
    torch.manual_seed(0)
    nvec = (3, 2, 4)
    logits, other = torch.randn(5, 9), torch.randn(5, 9)
    action = torch.stack([torch.randint(n, (5,)) for n in nvec], -1)
    parts, others = torch.split(logits, nvec, -1), torch.split(other, nvec, -1)
    dists = [torch.distributions.Categorical(logits=p) for p in parts]
    torch.testing.assert_close(D.multi_categorical_log_prob(logits, nvec, action),
                               sum(d.log_prob(action[:, k]) for k, d in enumerate(dists)))
    torch.testing.assert_close(D.multi_categorical_entropy(logits, nvec), sum(d.entropy() for d in dists))
    torch.testing.assert_close(D.multi_categorical_kl(logits, other, nvec), sum(
        torch.distributions.kl_divergence(d, torch.distributions.Categorical(logits=q)) for d, q in zip(dists, others)))
    assert torch.equal(D.multi_categorical_mode(logits, nvec), torch.stack([p.argmax(-1) for p in parts], -1))
    draws = D.multi_categorical_sample(logits[:1].expand(20_000, 9), nvec)
    for k, (n, p) in enumerate(zip(nvec, parts)):   # each part's frequencies match its softmax
        freq = torch.bincount(draws[:, k], minlength=n).float() / 20_000
        torch.testing.assert_close(freq, p[0].softmax(-1), atol=0.015, rtol=0)


def test_multi_discrete_and_multi_binary_spaces_become_a_spec_with_parts():
    for env_id, nvec in (("fnrl-test/Match-v0", (3, 2)), ("fnrl-test/MatchBits-v0", (2, 2, 2))):
        env = envs.make(env_id, 2)
        try:
            spec = env.spec
            assert spec.action_nvec == nvec and spec.action_shape == (len(nvec),) and spec.action_dim == sum(nvec)
            assert spec.multi_discrete and not spec.discrete and not spec.continuous
            env.reset()
            out = env.step(torch.zeros(2, len(nvec), dtype=torch.int64))
            assert out["reward"].shape == (2,)
        finally:
            env.close()
    for algo in ("dqn", "sac"):
        config, _ = configure(algo, "fnrl-test/Match-v0")
        with pytest.raises(ConfigError, match="multi-discrete|discrete parts"):
            train(algo, config, compile=False, quiet=True, log_dir=None)


@pytest.mark.parametrize("env_id,best", [("fnrl-test/Match-v0", 20.0), ("fnrl-test/MatchBits-v0", 30.0)])
def test_ppo_learns_multi_part_actions_on_four_seeds(tmp_path, env_id, best):
    config, _ = configure("ppo", env_id, total_steps=8_192, num_envs=8, num_steps=64, learning_rate=3e-3)
    result = train("ppo", config, seed=0, num_seeds=4, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False, compile=False)
    evals = final_evaluations(result)   # a random policy scores half of `best` or less
    assert min(evals) >= 0.95 * best, evals


@pytest.mark.parametrize("algo", ["a2c", "impala"])
def test_a2c_and_impala_train_on_multi_part_actions(tmp_path, algo):
    config, _ = configure(algo, "fnrl-test/Match-v0", total_steps=2_048)
    result = train(algo, config, log_dir=tmp_path / "run", compile=False, quiet=True, tensorboard=False,
                   plot=False, eval_episodes=2)
    # a smoke test of the multi-part distribution in their losses: an evaluation of whole episodes
    returns = result.eval_returns[0]
    assert len(returns) == 2 and all(r == int(r) and 0 <= r <= 20 for r in returns)
    assert all(math.isfinite(v) for row in result.history for k, v in row.items()
               if k.startswith("loss") and isinstance(v, float))
