"""Networks, used functionally through their parameter TensorDict.

>>> net = mlp(4, 2, hidden=(64, 64))
>>> params = parameters(net)                 # TensorDict of plain tensors
>>> logits = call(net, params, obs)          # torch.func.functional_call
"""
from fnrl.nets.core import (
    A3CConv,
    ActorCritic,
    NatureCNN,
    call,
    encoder,
    layer_init,
    mlp,
    parameters,
)

__all__ = ["A3CConv", "ActorCritic", "NatureCNN", "call", "encoder", "layer_init", "mlp", "parameters"]
