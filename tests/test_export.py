"""`fnrl export --format pt2|onnx`: the deterministic policy as a program that runs without fnrl.

The programs must act as `act(state, obs, None, explore=False)` does on observations the trained
policy meets, at any batch size, with the run's observation normalization inside."""
from __future__ import annotations

import onnxruntime
import pytest
import torch

from fnrl import algos, envs
from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.evaluate import load_run
from fnrl.export import export_policy
from fnrl.presets import configure
from fnrl.train import train

CASES = {
    "ppo-discrete": ("ppo", "CartPole-v1", {}),
    "ppo-continuous": ("ppo", "Pendulum-v1", {"normalize_obs": True}),
    "dqn": ("dqn", "CartPole-v1", {"learning_starts": 256}),
    "sac": ("sac", "Pendulum-v1", {"learning_starts": 256, "batch_size": 64}),
}


def _trained(tmp_path, algo: str, env_id: str, fields: dict):
    config, _ = configure(algo, env_id, preset="none", total_steps=1024, num_envs=4, **fields)
    run = tmp_path / "run"
    train(algo, config, seed=3, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False,
          eval_episodes=0)
    return run


def _recorded_observations(run, steps: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    """Observations of 4 envs driven by the trained policy without exploration, and its actions on them."""
    name, config, state = load_run(run)
    env = envs.make(config.env_id, 4, seed=[11, 12, 13, 14])
    agent = algos.load(name).make(config, env.spec)
    observations, actions = [], []
    try:
        obs = env.reset()["obs"]
        for _ in range(steps):
            with torch.no_grad():
                action = agent.act(state, obs, None, False)[0]
            observations.append(obs)
            actions.append(action)
            obs = env.step(action)["obs"]
    finally:
        env.close()
    return torch.cat(observations), torch.cat(actions)


def _assert_same_actions(got, expected) -> None:
    got = torch.as_tensor(got)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if expected.is_floating_point():
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, expected)


@pytest.mark.parametrize("case", list(CASES))
def test_an_exported_program_acts_as_the_policy_without_exploration(tmp_path, case):
    algo, env_id, fields = CASES[case]
    run = _trained(tmp_path, algo, env_id, fields)
    obs, expected = _recorded_observations(run)
    assert main(["export", str(run), "--format", "pt2"]) == 0
    assert main(["export", str(run), "--format", "onnx", "--out", str(tmp_path / "deploy.onnx")]) == 0
    program = torch.export.load(run / "policy.pt2").module()
    session = onnxruntime.InferenceSession(str(tmp_path / "deploy.onnx"))
    name = session.get_inputs()[0].name
    for rows in (slice(0, 1), slice(0, 7), slice(None)):   # any batch size
        _assert_same_actions(program(obs[rows]), expected[rows])
        _assert_same_actions(session.run(None, {name: obs[rows].numpy()})[0], expected[rows])
    if fields.get("normalize_obs"):   # the normalization is inside: the statistics moved in training
        _, _, state = load_run(run)
        assert not torch.allclose(state["obs_rms"]["mean"], torch.zeros_like(state["obs_rms"]["mean"]))


def test_what_cannot_be_exported_is_one_clear_error(tmp_path):
    run = _trained(tmp_path, "ppo", "CartPole-v1", {"core": "lstm", "num_steps": 32})
    with pytest.raises(ConfigError, match="recurrent core .* feed-forward policies"):
        export_policy(run, format="pt2")
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        export_policy(run, format="tflite")
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("policy")) == []   # nothing written
