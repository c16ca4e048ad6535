"""A torso of your own (`--conv module:name`, `fnrl.nets.core.user_torso`) in place of the
built-in one: trained with the heads, rebuilt from config.json by eval, refused clearly when it
cannot be loaded."""
from __future__ import annotations

import pytest
import torch

from fnrl.errors import ConfigError
from fnrl.evaluate import evaluate_checkpoint
from fnrl.presets import configure
from fnrl.train import train
from tests.learning import final_evaluations

TORSO = "experiments.custom_torso:residual_mlp"


@pytest.mark.parametrize("algo,fields", [("ppo", {}), ("dqn", {"learning_starts": 256}),
                                         ("r2d1", {"learning_starts": 256})])
def test_a_users_torso_is_trained_with_the_heads_and_rebuilt_by_eval(tmp_path, algo, fields):
    config, _ = configure(algo, "CartPole-v1", preset="none", total_steps=2048, conv=TORSO, **fields)
    result = train(algo, config, log_dir=tmp_path / "run", compile=False, quiet=True, tensorboard=False,
                   plot=False, eval_episodes=2)
    leaves = dict(result.state["params"].items(include_nested=True, leaves_only=True))
    names = [".".join(k) if isinstance(k, tuple) else k for k in leaves]
    assert any("blocks.1.0" in n for n in names), names   # the torso's second block's LayerNorm
    assert all(torch.isfinite(v).all() for v in leaves.values())
    name, returns = evaluate_checkpoint(tmp_path / "run", episodes=2)   # config.json's conv rebuilds it
    assert name == algo and len(returns) == 2


def test_ppo_learns_cartpole_with_a_users_torso_on_two_seeds(tmp_path):
    config, _ = configure("ppo", "CartPole-v1", conv=TORSO)   # the preset's settings and budget
    result = train("ppo", config, seed=0, num_seeds=2, log_dir=tmp_path / "run", quiet=True, tensorboard=False,
                   plot=False)
    assert min(final_evaluations(result)) >= 475, final_evaluations(result)


def test_a_torso_that_cannot_be_loaded_or_made_is_one_clear_error():
    for conv, says in (("no_such_module:f", "cannot load torso 'no_such_module:f'"),
                       ("experiments.custom_torso:nope", "cannot load torso"),
                       ("resnet", "--conv must be nature, a3c or a torso factory")):
        config, _ = configure("ppo", "CartPole-v1", conv=conv)
        with pytest.raises(ConfigError, match=says):
            train("ppo", config, compile=False, quiet=True)
    config, _ = configure("ppo", "Pong-v5", conv=TORSO)   # the factory refuses image observations
    with pytest.raises(ValueError, match="residual_mlp takes vector observations"):
        train("ppo", config, compile=False, quiet=True, log_dir=None)
