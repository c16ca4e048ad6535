"""The compile wiring of one algorithm's agent, and the stance of a warm training loop.

`make_agent` compiles an algorithm's `act` and `update` for a single-seed run; `compile_update`,
`act_randomness` and `ahead_of_time_act` are the decisions it makes, which `fnrl.seeds.make_agent`
applies to vmapped rows. Acting is compiled ahead of time where it can be (`fnrl.accel.aot.AotAct`),
with a `torch.compile`d `act` for the calls that model does not serve (evaluation, recurrent
carries). Acting is compiled with Inductor's `fallback_random`, so it draws exactly the random
numbers eager acting draws (the same actions as `compile=False`, and the tiers of a tiered run,
`fnrl.accel.tiered`, act alike). The
measurements behind these choices are in docs/decisions.md ("Acting is compiled ahead of time").
What a run turns on or off is `fnrl.accel.AccelOptions`, passed in.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from fnrl.accel import aot
from fnrl.accel.inductor import compile_on_first_call, compile_with_cpp_wrapper_on_cpu
from fnrl.accel.options import AccelOptions, resolve


def make_agent(module, config, spec, compile: bool, update_compiled_by_learner: bool = False,
               accel: AccelOptions | None = None):
    """`module.make(config, spec)`, compiled: modules that sequence compiled pieces themselves
    (`"compile" in SPEC.make_options`) are given `compile=` and `ahead_of_time=`; otherwise the
    whole update is compiled here (unless `update_compiled_by_learner`: the fused learner step of
    `fnrl.learner` compiles it with the replay draw, so `update` stays eager here). Acting is
    compiled too: ahead of time where `accel.ahead_of_time`, behind a `torch.compile`d fallback
    that uses `cpp_wrapper` on the CPU. accel: None reads the environment (`AccelOptions.from_environ`)."""
    accel = resolve(accel)
    algorithm = module.SPEC
    if "compile" in algorithm.make_options:
        agent = module.make(config, spec, compile=compile, ahead_of_time=accel.ahead_of_time)
    else:
        agent = module.make(config, spec)
        if compile and not update_compiled_by_learner:
            agent = agent._replace(update=compile_update(agent.update))
    if compile:
        randomness = act_randomness(algorithm)
        act = compile_with_cpp_wrapper_on_cpu(agent.act, randomness, fullgraph=True, dynamic=False)
        fallback = act if algorithm.act_keys is None else acting_on(algorithm.act_keys, act)
        agent = agent._replace(act=ahead_of_time_act(agent.act, algorithm, fallback, accel))
    return agent


def compile_update(update):
    """An update compiled whole: one graph (`fullgraph`), static shapes (at its first call)."""
    return compile_on_first_call(update, fullgraph=True, dynamic=False)


def act_randomness(algorithm) -> dict:
    """The Inductor options of a compiled `act` of algorithm spec `algorithm`: it draws what eager
    acting draws (`fallback_random`), so compiling leaves the actions and the exploration as they
    are (about as fast as Inductor's own generator for a CartPole policy,
    `docs/decisions.md`, "Tiered execution")."""
    return {"fallback_random": True}


def ahead_of_time_act(eager_act, algorithm, fallback, accel: AccelOptions):
    """`fallback` (a compiled `act`), or where `accel.ahead_of_time` an `aot.AotAct` of
    `eager_act` that serves the sampler's calls and passes the others to `fallback`."""
    if not accel.ahead_of_time:
        return fallback
    return aot.AotAct(eager_act, algorithm.act_keys, fallback, act_randomness(algorithm))


def acting_on(keys, act):
    """`act(state, obs, carry, explore)` that passes on only `state.select(*keys)` (keys missing
    from the state are skipped), for a module that declares the state its `act` reads as
    `SPEC.act_keys` (nested keys as tuples, e.g. `("params", "actor")`; `env_steps` included).

    A compiled `act` guards every tensor of its arguments on every call (TorchDynamo's cache
    lookup); given the few tensors it reads instead of the whole training state (parameters,
    target parameters, optimizer moments) the lookup is that much cheaper, with the same result."""
    keys = tuple(keys)

    def act_on_selected(state, obs, carry, explore: bool = True):
        return act(state.select(*keys, strict=False), obs, carry, explore)

    return act_on_selected


def steady(warm: bool):
    """Where every compiled function of the loop has run once with the shapes it will keep:
    TorchDynamo skips guard evaluation (`skip_guard_eval_unsafe`), keeping only the guards that
    tell its cache entries apart. The loop calls act, the update (and replay add / sample) with the
    same structures every time, and each call's guard check costs about as much as the math of a
    small network on the CPU. A call that would still need a new graph raises a RuntimeError
    ("Recompilation triggered with skip_guard_eval_unsafe stance") rather than run a wrong one;
    `AccelOptions.skip_guards` off keeps them. Elsewhere (warm False): a no-op context."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if warm else contextlib.nullcontext()


class HeldStance:
    """`steady`'s stance entered once the loop is warm and kept across its iterations (entering and
    leaving it each iteration would cost a measurable share of a small step's Python); `release`
    leaves it for logging, evaluation and checkpoints, and the next `hold` enters it again. A process
    that has not imported TorchDynamo has compiled nothing with it, so there are no guards to skip:
    `hold` waits until it is imported (a tiered run's eager tier never imports it)."""

    def __init__(self):
        self._stance = None

    def hold(self, warm: bool) -> None:
        if warm and self._stance is None and "torch._dynamo" in sys.modules:
            self._stance = steady(True)
            self._stance.__enter__()

    def release(self) -> None:
        if self._stance is not None:
            stance, self._stance = self._stance, None
            stance.__exit__(None, None, None)
