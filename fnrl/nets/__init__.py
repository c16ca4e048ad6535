"""Networks, used functionally through their parameter TensorDict.

>>> net = mlp(4, 2, hidden=(64, 64))
>>> params = parameters(net)                 # TensorDict of plain tensors
>>> logits = call(net, params, obs)          # torch.func.functional_call

Recurrent cores (LSTMCore, GRUCore) and their pure `unroll` / `step` with episode
resets inside the unroll: see fnrl.nets.recurrent.
"""
from fnrl.nets.core import (
    A3CConv,
    ActorCritic,
    Linear,
    NarrowLinear,
    NatureCNN,
    call,
    encoder,
    layer_init,
    mlp,
    parameters,
)
from fnrl.nets.recurrent import GRUCore, LSTMCore, RecurrentActorCritic, make_core, reset_carry, step, unroll

__all__ = ["A3CConv", "ActorCritic", "Linear", "NarrowLinear", "NatureCNN", "RecurrentActorCritic", "call", "encoder", "layer_init", "mlp", "parameters",
           "LSTMCore", "GRUCore", "make_core", "reset_carry", "step", "unroll"]
