"""A torso of your own (`--conv module:name`, `make(config, spec, network=...)`,
`fnrl.nets.core.user_torso`) in place of the built-in one: trained with the heads, rebuilt from
config.json by eval, refused clearly when it cannot be loaded."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from experiments.custom_torso import ResidualMLP, residual_mlp
from fnrl import envs
from fnrl.algos import a2c, dqn, impala, ppo, qpg, r2d1
from fnrl.errors import ConfigError
from fnrl.nets.core import user_torso
from fnrl.evaluate import evaluate_checkpoint
from fnrl.presets import configure
from fnrl.train import train
from fnrl.samplers.serial import SerialSampler
from tests import test_dqn, test_qpg, test_r2d1
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


@pytest.mark.slow
@pytest.mark.matrix   # the updates through a user's torso are checked below for every algorithm
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


def _on_policy_case(module):
    env = envs.make("CartPole-v1", 4, seed=0)
    config = dataclasses.replace(module.Config(), num_envs=4, num_steps=16)

    def batch(agent, state):
        return SerialSampler(env, agent.act, config.num_steps).collect(state).clone()
    return config, env.spec, batch


def _case(name):
    """(module, config, env spec, batch(agent, state)) of one algorithm, the batch its update takes."""
    if name in ("ppo", "a2c", "impala"):
        module = {"ppo": ppo, "a2c": a2c, "impala": impala}[name]
        return (module, *_on_policy_case(module))
    if name == "dqn":
        return dqn, test_dqn.config(), test_dqn.SPEC, lambda agent, state: test_dqn.make_batch()
    if name == "r2d1":
        config = test_r2d1.config()
        return r2d1, config, test_r2d1.SPEC, lambda agent, state: test_r2d1.make_batch(config)
    spec = test_qpg.make_spec()
    return qpg, test_qpg.config(name), spec, lambda agent, state: test_qpg.batch(spec=spec)


def _torso_leaves(params) -> dict:
    """The torso's parameters (every "blocks" leaf; the actor's and each critic's for SAC / TD3)."""
    return {k: v for k, v in params.items(include_nested=True, leaves_only=True) if "blocks" in k}


@pytest.mark.parametrize("name", ["ppo", "a2c", "impala", "dqn", "r2d1", "sac", "td3"])
def test_make_takes_a_users_network_and_its_update_trains_it(name):
    """`make(config, spec, network=...)` with a factory or an nn.Module: the torso's parameters
    live in the state, a factory builds the same network as its `--conv module:name`, an
    instance's weights are every init's, and one update moves the torso with the heads."""
    module, config, spec, batch = _case(name)
    agent = module.make(config, spec, network=residual_mlp)
    state = agent.init(0)
    torso = _torso_leaves(state["params"])
    assert len(torso) >= 8, list(state["params"].keys(True, True))
    if hasattr(config, "conv"):   # the same network as the factory given by name, from the same seed
        named = module.make(dataclasses.replace(config, conv=TORSO), spec).init(0)["params"]
        assert all(torch.equal(v, named[k]) for k, v in state["params"].items(True, True))
    new_state, metrics = agent.update(state, batch(agent, state))
    moved = _torso_leaves(new_state["params"])
    assert any(not torch.equal(moved[k], v) for k, v in torso.items())
    assert all(torch.isfinite(v).all() for v in moved.values())

    pretrained = ResidualMLP(spec.obs_shape[0])
    with torch.no_grad():
        pretrained.blocks[1][1].weight.fill_(0.25)
    state = module.make(config, spec, network=pretrained).init(1)
    weights = [v for k, v in _torso_leaves(state["params"]).items() if k[-4:] == ("blocks", "1", "1", "weight")]
    assert weights and all(torch.equal(w, torch.full_like(w, 0.25)) for w in weights)
    assert pretrained.blocks[1][1].weight.requires_grad   # the user's module is left as it was


def test_a_network_given_to_make_that_makes_no_module_is_one_clear_error():
    spec = envs.make("CartPole-v1", 2, seed=0).spec
    with pytest.raises(ConfigError, match="must return .nn.Module, feature size. or an nn.Module"):
        ppo.make(ppo.Config(), spec, network=lambda obs_shape: "not a module")
    with pytest.raises(ConfigError, match="--conv must be nature, a3c or a torso factory"):
        ppo.make(dataclasses.replace(ppo.Config(), conv=residual_mlp), spec)


def test_the_examples_hand_written_loop_trains_ppo_with_a_network_given_to_make():
    from experiments.custom_torso import main

    assert 5 <= main(total_steps=4096) <= 500


def test_a_module_with_batch_statistics_is_sized_without_changing_it():
    """The feature size of an nn.Module without `out_dim` is read in eval mode: its running
    statistics, its mode and the random generators stay as they were."""
    spec = envs.make("CartPole-v1", 2, seed=0).spec
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    generator_state = torch.get_rng_state()
    copy, out_dim = user_torso(module, (4,))
    assert out_dim == 8 and copy.training and module.training
    assert torch.equal(torch.get_rng_state(), generator_state)
    agent = ppo.make(ppo.Config(), spec, network=module)
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())
    assert agent.init(0)["params"]["actor", "weight"].shape == (2, 8)
