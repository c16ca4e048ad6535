"""The compile wiring of one algorithm's agent, and the stance of a warm training loop.

`make_agent` is the one place an algorithm's `act` and `update` are compiled for a single-seed
run (vmapped rows: `fnrl.seeds.make_agent`). Acting is compiled ahead of time where it can be
(`fnrl.accel.aot.AotAct`), with a `torch.compile`d `act` for the calls that model does not
serve (evaluation, recurrent carries). Off-policy acting is compiled with Inductor's
`fallback_random`, so it draws exactly the random numbers eager acting draws (the same
exploration as `compile=False`). The measurements behind these choices are in
docs/decisions.md ("Acting is compiled ahead of time").

Two switches, module attributes so a probe or test can turn them off:

- `SKIP_GUARDS`: a warm loop skips TorchDynamo's guard checks (`steady`);
- `FUSED_LEARNER`: off-policy runs sample and update in one compiled graph (`fnrl.learner`).
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from fnrl.accel import aot
from fnrl.accel.inductor import compile_with_cpp_wrapper_on_cpu

SKIP_GUARDS = True
"""Runs with compile=True skip TorchDynamo's guard checks once warm (see `steady`);
set False to keep them (e.g. while changing an algorithm's act or update)."""

FUSED_LEARNER = True
"""Off-policy runs with compile=True sample and update in one compiled graph, the state donated
(`fnrl.learner`), for a row replay without frame deduplication and one seed; set False for a
separately compiled sample and update (benchmarks/probes/learner_step.py compares the two)."""


def make_agent(module, config, spec, compile: bool, update_compiled_by_learner: bool = False):
    """`module.make(config, spec)`, compiled: modules that sequence compiled pieces themselves take
    `compile=`; otherwise the whole update is compiled here (unless `update_compiled_by_learner`:
    the fused learner step of `fnrl.learner` compiles it with the replay draw, so `update` stays
    eager here). Acting is compiled too: ahead of time where `aot.ENABLED`, behind a
    `torch.compile`d fallback that uses `cpp_wrapper` on the CPU."""
    if "compile" in inspect.signature(module.make).parameters:
        agent = module.make(config, spec, compile=compile)
    else:
        agent = module.make(config, spec)
        if compile and not update_compiled_by_learner:
            agent = agent._replace(update=torch.compile(agent.update, fullgraph=True, dynamic=False))
    if compile:
        randomness = {"fallback_random": True} if module.SPEC.off_policy else {}
        act = compile_with_cpp_wrapper_on_cpu(agent.act, randomness, fullgraph=True, dynamic=False)
        keys = module.SPEC.act_keys
        fallback = act if keys is None else acting_on(keys, act)
        act = aot.AotAct(agent.act, keys, fallback, randomness) if aot.ENABLED else fallback
        agent = agent._replace(act=act)
    return agent


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
    SKIP_GUARDS = False turns this off. Elsewhere (warm False): a no-op context."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if warm else contextlib.nullcontext()


class HeldStance:
    """`steady`'s stance entered once the loop is warm and kept across its iterations (entering and
    leaving it each iteration would cost a measurable share of a small step's Python); `release`
    leaves it for logging, evaluation and checkpoints, and the next `hold` enters it again."""

    def __init__(self):
        self._stance = None

    def hold(self, warm: bool) -> None:
        if warm and self._stance is None:
            self._stance = steady(True)
            self._stance.__enter__()

    def release(self) -> None:
        if self._stance is not None:
            stance, self._stance = self._stance, None
            stance.__exit__(None, None, None)
