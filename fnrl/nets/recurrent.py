"""Recurrent cores (LSTM, GRU) used functionally, with episode resets inside the unroll.

A core maps an input sequence and a carry (its recurrent state) to an output sequence
and the carry after the last step. Episode boundaries are handled *inside* the unroll
by a reset mask, so one [T, B] segment that spans an episode end is processed exactly
as two separate unrolls would be:

    carry_t' = where(reset_t, 0, carry_t)           (zero the state before step t)
    y_t, carry_{t+1} = cell(x_t, carry_t')

`reset[t]` is True when step t's input is the first observation of an episode. With
next-step autoreset (EnvPool, fnrl.envs.batched) the step after a done is the env's
reset step (`valid=False`, its observation is still the *final* observation of the old
episode), so the first observation of the new episode arrives one step later:

    reset[t] = not valid[t - 1]          (= done[t - 2]; True at the very first step)

The sampler (fnrl.samplers.serial) computes exactly this, stores it as
`rollout["reset"]` [T, B], and hands it to `act` inside the carry (`carry["reset"]`).
Keeping the state through the reset step means the value of a truncated episode's
final observation (its bootstrap value) is still computed from that episode's history.

The protocol between a recurrent agent's `act` and the sampler:
- `act(state, obs, carry, explore)` gets `carry=None` on the very first call (start from
  the zero initial carry), afterwards the TensorDict [B] it returned last time plus a
  `"reset"` [B] bool entry that the sampler sets; `act` zeroes the carry where it is True
  (`reset_carry`) before stepping, and a missing `"reset"` means no reset.
- `act` returns the carry after the step (the core's keys only) and, in
  `extras["carry"]`, the carry the step actually started from (after its reset), so the
  sampler stores it per step: `rollout["carry"]` [T, B] (a TensorDict). The carry a
  segment starts from is `rollout["carry"][0]`; replaying any step t from
  `rollout["carry"][t]` with `rollout["reset"][t:]` reproduces the sampler's states
  exactly (the reset is idempotent).

    core = LSTMCore(input_size=64, hidden_size=128)
    params = fnrl.nets.parameters(core)                   # TensorDict
    carry = core.initial_carry([B])                       # {"h", "c"}: zeros [B, H]
    y, carry = unroll(core, params, x, reset, carry)      # x [T, B, I], reset [T, B]
    y1, carry = step(core, params, x0, reset0, carry)     # x0 [B, I], reset0 [B]

Everything here is pure: no in-place writes, no Python branching on tensor values;
the unroll is a Python loop over the (static) T, so it compiles with
`torch.compile(fullgraph=True)` (compile time grows with T; T <= 80 is fine) and
works under `torch.func.vmap` and `torch.func.grad`. The input projection of all T
steps is one matrix product; only the recurrent product runs per step.

Parameter names and gate orders match `torch.nn.LSTM` / `torch.nn.GRU`
(`weight_ih [G*H, I]`, `weight_hh [G*H, H]`, `bias_ih`, `bias_hh`; LSTM gates i, f, g, o;
GRU gates r, z, n), so weights can be copied between them.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from fnrl.nets.core import Flatten, Linear, encoder, layer_init, mlp, tanh


def reset_carry(carry: TensorDict, reset: torch.Tensor) -> TensorDict:
    """`carry` with the entries of the batch elements where `reset` is True set to zero.

    carry: TensorDict [*batch] of tensors [*batch, ...]; reset: [*batch] bool.
    """
    keep = (~reset).to(torch.float32)

    def zero(x):
        return x * keep.reshape(*keep.shape, *(1,) * (x.dim() - keep.dim())).to(x.dtype)

    return carry.apply(zero)


class _Core(nn.Module):
    """Shared unroll of the gated cores; subclasses define `gates`, `carry_keys` and `cell`."""

    num_gates: int
    carry_keys: tuple[str, ...]

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        g = self.num_gates * hidden_size
        self.weight_ih = nn.Parameter(torch.empty(g, input_size))
        self.weight_hh = nn.Parameter(torch.empty(g, hidden_size))
        self.bias_ih = nn.Parameter(torch.zeros(g))
        self.bias_hh = nn.Parameter(torch.zeros(g))
        # orthogonal per-gate blocks, zero biases (CleanRL's recurrent PPO initialization)
        for w in (self.weight_ih, self.weight_hh):
            for block in w.data.split(hidden_size):
                nn.init.orthogonal_(block)

    def initial_carry(self, batch_shape, device=None, dtype=torch.float32) -> TensorDict:
        """Zeros: a TensorDict [*batch_shape] with one [*batch_shape, H] entry per carry key."""
        batch_shape = torch.Size(batch_shape)
        return TensorDict({k: torch.zeros(*batch_shape, self.hidden_size, device=device, dtype=dtype)
                           for k in self.carry_keys}, batch_size=batch_shape, device=device)

    def forward(self, x: torch.Tensor, reset: torch.Tensor, carry: TensorDict):
        """Unroll over time. x [T, *batch, I], reset [T, *batch] bool, carry [*batch].

        Returns (y [T, *batch, H], carry after step T-1).
        """
        xp = x @ self.weight_ih.T + self.bias_ih  # all input projections at once
        keep = (~reset).to(xp.dtype).unsqueeze(-1)
        # plain tensors inside the loop: tracing T TensorDict constructions is slow to compile
        state = tuple(carry[k] for k in self.carry_keys)
        ys = []
        for t in range(x.shape[0]):
            y, state = self.cell(xp[t], tuple(s * keep[t] for s in state))
            ys.append(y)
        return torch.stack(ys), TensorDict(dict(zip(self.carry_keys, state)), batch_size=carry.batch_size)

    def cell(self, xp: torch.Tensor, state: tuple):  # pragma: no cover - abstract
        """One step from the projected input xp [*, G*H] and the carry tensors -> (y, new carry tensors)."""
        raise NotImplementedError


class LSTMCore(_Core):
    """LSTM (Hochreiter & Schmidhuber 1997), as torch.nn.LSTM computes it.

    i, f, g, o = split(W_ih x + b_ih + W_hh h + b_hh)
    c' = sigmoid(f) c + sigmoid(i) tanh(g),   h' = sigmoid(o) tanh(c'),   y = h'.
    Carry: {"h", "c"} [*batch, H].
    """

    num_gates = 4
    carry_keys = ("h", "c")

    def cell(self, xp, state):
        h, c = state
        gates = xp + h @ self.weight_hh.T + self.bias_hh
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * tanh(g)
        h = torch.sigmoid(o) * tanh(c)
        return h, (h, c)


class GRUCore(_Core):
    """GRU (Cho et al. 2014, arXiv:1406.1078), as torch.nn.GRU computes it.

    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz),
    n = tanh(W_in x + b_in + r (W_hn h + b_hn)),  h' = (1 - z) n + z h,  y = h'.
    Carry: {"h"} [*batch, H].
    """

    num_gates = 3
    carry_keys = ("h",)

    def cell(self, xp, state):
        (h,) = state
        hp = h @ self.weight_hh.T + self.bias_hh
        xr, xz, xn = xp.chunk(3, -1)
        hr, hz, hn = hp.chunk(3, -1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = tanh(xn + r * hn)
        h = (1 - z) * n + z * h
        return h, (h,)


CORES = {"lstm": LSTMCore, "gru": GRUCore}


def make_core(kind: str, input_size: int, hidden_size: int) -> _Core:
    """`"lstm"` or `"gru"` -> a fresh core."""
    return CORES[kind](input_size, hidden_size)


def unroll(core: _Core, params: TensorDict, x: torch.Tensor, reset: torch.Tensor, carry: TensorDict):
    """Run `core` with `params` over a sequence, zeroing the carry where `reset` is True.

    x: [T, B, I]; reset: [T, B] bool (True: step t starts an episode, the carry is zeroed
    before it); carry: TensorDict [B]. Returns (y [T, B, H], carry after step T-1).
    Pure; compiles with fullgraph=True; vmappable (any extra leading batch dims work too).
    """
    return torch.func.functional_call(core, params.flatten_keys(".").to_dict(), (x, reset, carry))


def step(core: _Core, params: TensorDict, x: torch.Tensor, reset: torch.Tensor, carry: TensorDict):
    """One step of `unroll`: x [B, I], reset [B] bool, carry [B] -> (y [B, H], carry)."""
    y, carry = unroll(core, params, x.unsqueeze(0), reset.unsqueeze(0), carry)
    return y.squeeze(0), carry


class RecurrentActorCritic(nn.Module):
    """torso -> recurrent core (LSTM / GRU) -> linear policy and value heads.

    `forward(obs [T, B, *obs], reset [T, B] bool, carry [B]) -> (policy_out [T, B, A],
    value [T, B], carry)`: the core is unrolled over T with the carry zeroed where
    `reset` is True (fnrl.nets.recurrent). Vector observations: separate actor and
    critic stacks, each an MLP torso (`hidden`; empty for none) and its own core (as
    sb3-contrib's RecurrentPPO with a critic LSTM); the carry is
    `{"actor": core carry, "critic": core carry}`. Image observations: one conv torso
    and one core shared by both heads (CleanRL's recurrent PPO); the carry is the core's.
    Continuous actions add a state-independent `log_std` [A].
    """

    def __init__(self, obs_shape, action_dim: int, continuous: bool, core: str = "lstm", core_size: int = 128,
                 hidden=(64,), activation: str = "tanh", conv="nature", init_log_std: float = 0.0):
        super().__init__()
        image = encoder(obs_shape, conv)
        self.separate = image is None
        if self.separate:
            shapes = obs_shape.values() if isinstance(obs_shape, dict) else [obs_shape]
            d = sum(int(torch.Size(s).numel()) for s in shapes)
            self.torso = Flatten(obs_shape)
            self.actor_torso = mlp(d, None, hidden, activation)
            self.critic_torso = mlp(d, None, hidden, activation)
            d = hidden[-1] if hidden else d
            self.core = make_core(core, d, core_size)
            self.critic_core = make_core(core, d, core_size)
        else:
            self.torso, d = image
            self.core = make_core(core, d, core_size)
        self.actor = layer_init(Linear(core_size, action_dim), 0.01)
        self.critic = layer_init(Linear(core_size, 1), 1.0)
        self.continuous = continuous
        if continuous:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    @property
    def carry_keys(self) -> tuple[str, ...]:
        return ("actor", "critic") if self.separate else self.core.carry_keys

    def initial_carry(self, batch_shape, device=None) -> TensorDict:
        """Zeros, the structure `forward` takes and returns."""
        one = self.core.initial_carry(batch_shape, device=device)
        if not self.separate:
            return one
        return TensorDict({"actor": one, "critic": one.clone()}, batch_size=one.batch_size, device=device)

    def forward(self, obs, reset, carry):
        x = self.torso(obs)
        if not self.separate:
            y, carry = self.core(x, reset, carry)
            return self.actor(y), self.critic(y).squeeze(-1), carry
        ya, ca = self.core(self.actor_torso(x), reset, carry["actor"])
        yc, cc = self.critic_core(self.critic_torso(x), reset, carry["critic"])
        out = TensorDict({"actor": ca, "critic": cc}, batch_size=carry.batch_size)
        return self.actor(ya), self.critic(yc).squeeze(-1), out
