"""Training states that compile cleanly: every algorithm's initial state, checked leaf by leaf."""
import dataclasses

import pytest
import torch
from tensordict import TensorDict

from fnrl import envs, optim
from fnrl.algos import ALGOS, default_config, load

ENV = {"fnrl.algos.qpg": "Pendulum-v1"}


def _state(name):
    module, config = load(name), default_config(name)
    config = dataclasses.replace(config, env_id=ENV.get(ALGOS[name], "CartPole-v1"))
    spec = envs.env_spec(config.env_id, getattr(config, "num_envs", 1))
    return module.make(config, spec).init(0)


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_no_zero_dim_float64_leaf(name):
    """TorchDynamo gives a 0-d float64 CPU input a Python-float symbol, and a compiled update
    taking one traces twice (the first trace ends in `_tensorify_python_scalars`' restart):
    about 9 of PPO's 21 s of cold tracing. Hyperparameters in the state use the parameters'
    dtype instead (`optim.hyperparameter`)."""
    state = _state(name)
    bad = [k for k, v in state.items(include_nested=True, leaves_only=True)
           if v.dim() == 0 and v.dtype == torch.float64 and v.device.type == "cpu"]
    assert not bad, f"0-d float64 leaves in the {name} state: {bad}"


def test_hyperparameter_takes_the_parameters_dtype_and_device():
    for dtype in (torch.float32, torch.float64):
        params = TensorDict({"step": torch.zeros((), dtype=torch.int64), "w": torch.ones(2, dtype=dtype)}, [])
        lr = optim.hyperparameter(3e-4, params)
        assert lr.shape == () and lr.dtype == dtype and lr.device == params["w"].device
        assert lr.item() == pytest.approx(3e-4)
    assert optim.hyperparameter(0.5, torch.zeros(1, dtype=torch.float64)).dtype == torch.float64
