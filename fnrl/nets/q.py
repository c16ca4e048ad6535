"""Q-networks for the DQN family: one module, the head chosen by arguments.

    net = QNetwork(obs_shape, num_actions, head="categorical", num_outputs=51, dueling=True)
    out = call(net, params, obs)               # [*, A, K]
    out = call(iqn_net, params, obs, taus)     # IQN, taus [*, M] -> [*, A, M]

The torso is an MLP for vector observations and the Nature CNN (which divides uint8
pixels by 255 itself) for [C, H, W] images. The head gives K numbers per action:

| head | K | meaning |
|---|---|---|
| "q" | 1 | Q(s, a) (Mnih et al. 2015) |
| "categorical" | atoms | logits of the return distribution over a fixed support (C51) |
| "quantile" | quantiles | return quantiles at fixed fractions (QR-DQN) |
| "iqn" | M taus | return quantiles at sampled fractions (IQN) |

`dueling=True` splits the head into a state value V [*, 1, K] and advantages
A [*, A, K] combined as V + A - mean_a A (Wang et al. 2016, arXiv:1511.06581; the same
combination on logits is Rainbow's distributional dueling head).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fnrl.nets.core import Linear, encoder, layer_init, mlp

__all__ = ["QNetwork", "cosine_embedding", "scale_gradient"]


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Identity in the forward pass; multiplies the gradient flowing back through x by `scale`."""
    return x * scale + x.detach() * (1.0 - scale)


def cosine_embedding(taus: torch.Tensor, dim: int) -> torch.Tensor:
    """IQN's cosine features of quantile fractions (Dabney et al. 2018, arXiv:1806.06923, eq. 4).

    e_i(tau) = cos(pi * i * tau),  i = 0..dim-1.
    taus: [..., M]. Returns [..., M, dim].
    """
    i = torch.arange(dim, dtype=taus.dtype, device=taus.device)
    return torch.cos(math.pi * i * taus.unsqueeze(-1))


class QNetwork(nn.Module):
    """Torso + (dueling) Q / categorical / quantile / IQN head.

    obs_shape: one observation; [C, H, W] selects the conv torso `conv`, anything else the
        MLP of `hidden` sizes and `activation` over the flattened observation.
    num_actions: A.  head: "q", "categorical", "quantile" or "iqn".
    num_outputs: K numbers per action (atoms or quantiles; 1 for "q" and "iqn").
    dueling: value and advantage streams; the gradient into the torso is scaled by
        1/sqrt(2) as in Wang et al. (2016, sec. 4.2) and rlpyt.
    cosine_dim: IQN's number of cosine features n (64 in the paper).

    forward(obs [*, *obs]) -> [*, A, K];  IQN: forward(obs, taus [*, M]) -> [*, A, M]. IQN
    multiplies the torso features by a ReLU embedding of cos(pi i tau) and adds one hidden
    layer of the torso's width before the output (the paper's fc 512 after the product).
    """

    def __init__(self, obs_shape, num_actions: int, head: str = "q", num_outputs: int = 1, dueling: bool = False,
                 hidden=(256, 256), activation: str = "relu", conv="nature", cosine_dim: int = 64):
        super().__init__()
        image = encoder(obs_shape, conv)
        if image is None:
            self.torso = mlp(int(torch.Size(obs_shape).numel()), None, hidden, activation)
            width = hidden[-1]
        else:
            self.torso, width = image
        self.obs_ndim = len(obs_shape)
        self.flatten_obs = image is None
        self.head, self.num_actions, self.num_outputs = head, num_actions, num_outputs
        self.dueling, self.cosine_dim = dueling, cosine_dim
        if head == "iqn":
            self.tau_embedding = nn.Sequential(layer_init(Linear(cosine_dim, width)), nn.ReLU())
            self.post = nn.Sequential(layer_init(Linear(width, width)), nn.ReLU())
        self.out = layer_init(Linear(width, num_actions * num_outputs), 1.0)
        if dueling:
            self.value = layer_init(Linear(width, num_outputs), 1.0)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        """Features [*, D] -> [*, A, K]."""
        if self.dueling:
            h = scale_gradient(h, 2 ** -0.5)
        out = self.out(h).unflatten(-1, (self.num_actions, self.num_outputs))
        if self.dueling:
            out = self.value(h).unsqueeze(-2) + out - out.mean(dim=-2, keepdim=True)
        return out

    def forward(self, obs: torch.Tensor, taus: torch.Tensor | None = None) -> torch.Tensor:
        x = obs.flatten(-self.obs_ndim).to(self.out.weight.dtype) if self.flatten_obs else obs
        h = self.torso(x)
        if self.head != "iqn":
            return self._head(h)
        h = h.unsqueeze(-2) * self.tau_embedding(cosine_embedding(taus, self.cosine_dim))  # [*, M, D]
        return self._head(self.post(h)).squeeze(-1).transpose(-1, -2)  # [*, M, A, 1] -> [*, A, M]
