"""One off-policy learning step: replay sample -> update -> priority update.

    learn = make_learner(update, batch_size, prioritized, fused=True)
    state, buffer, metrics = learn(state, buffer, beta)    # buffer: fnrl.replay.ReplayBuffer

`update(state, batch) -> (state, metrics)` is an algorithm's pure update (DQN family,
DDPG / TD3 / SAC). The training loop (`fnrl.train`) calls `learn` `replay_ratio` times per
env step; it is the only caller.

fused=True (the loop's choice under `compile=True` for a row buffer without frame
deduplication, one seed): the draw (`fnrl.replay.draw`: leaves from the sum tree, the rows,
their n-step targets and importance weights), the loss, the gradient, the optimizer, the
target update and, for a prioritized buffer, the new priorities (`fnrl.replay.set_priorities`
with the tree's static-shape update) are **one compiled graph**, called once per update,
and the state is **donated**: the graph writes the new state into the tensors of the
state passed in (`state.update_(new_state)`, in place) and `learn` returns that same
TensorDict (and the buffer, whose tree and priorities it updated in place). JAX's
`jit(update, donate_argnums=0)` in PyTorch: `update` stays pure, the donation is the
caller's, and the loop never reads a state it has passed on.

What that saves, per update of CleanRL's DQN CartPole settings (batch 128, 120x84 MLP,
1 core; `benchmarks/probes/learner_step.md`): the separate compiled sample (a [N] batch
TensorDict rebuilt in Python) and the second compiled call's entry, and the Python that
rebuilds a new nested state TensorDict (params, target params, Adam moments) after every
update; on the CPU the graph's own calls are made from C++ (Inductor's `cpp_wrapper`).

It draws with Inductor's `fallback_random`, so it uses the random numbers that the eager
`replay.sample` + `update` draw: with the same seed both give the same batches and the same
parameters (`tests/test_learner.py`).

ahead_of_time=True (the loop's choice where `fnrl.accel.AccelOptions.ahead_of_time`): the same step, traced once
(`make_fx` on fake tensors, through `torch.func.grad`), exported and compiled by AOTInductor
(`fnrl.accel.aot.compile_traced`, cached on disk), then called with the ~40 tensor leaves of the
state and the buffer as a flat list. That skips TorchDynamo's frame hook, guard lookup and
AOTAutograd's wrappers around the graph: per DQN update (CleanRL's CartPole settings, 1 core)
~540 -> ~380 us; the arithmetic-bound SAC update 1.05x (`benchmarks/probes/learner_step.md`). A step that cannot be traced this way runs through
`torch.compile`, after one warning.

cuda_graph=True (fused, on a GPU; `fnrl train --cuda-graphs`): the compiled step is captured
in a CUDA graph at its third call and replayed after (`fnrl.accel.cudagraphs.GraphedStep`): one
launch per update instead of one per kernel. The donated state, the buffer written in place
and the refilled beta keep their addresses, which is what a replay needs; the metrics are
the graph's own tensors, rewritten by the next update.

fused=False: `replay.sample` (compiled as its own graph when `sample_options` say so), then
`update`, then `replay.update_priorities`: any buffer (sequence replay, vmapped rows' buffers
via `fnrl.replay.multi`, frame-deduplicated Atari stacks) and eager runs.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from fnrl.accel import aot
from fnrl import replay as row_replay
from fnrl.accel.inductor import compile_with_cpp_wrapper_on_cpu


def make_learner(update: Callable, batch_size: int, prioritized: bool, *, fused: bool, ahead_of_time: bool = False,
                 replay=row_replay, sample_options: dict | None = None, rows: bool = False,
                 cuda_graph: bool = False) -> Callable:
    """`learn(state, buffer, beta) -> (state, buffer, metrics)`: sample `batch_size` rows of
    `buffer`, apply `update` and (prioritized) write the new priorities `metrics["priority"]` [N];
    returns the new state and the buffer to use next, as `fnrl.replay`'s calls do.

    beta: the importance-sampling exponent, a float. fused: see the module docstring
    (`update` must then be the eager, uncompiled function; it is compiled here with the draw).
    ahead_of_time (fused=True only): serve the calls with an AOTInductor model of the fused step
    (module docstring), falling back to `torch.compile` with a warning where it cannot be built.
    cuda_graph (fused=True only, a CUDA buffer): replay the compiled step from a CUDA graph
    (module docstring); takes the place of ahead_of_time.
    replay, sample_options, rows (fused=False only): the replay module of `buffer`
    (`fnrl.replay`, `fnrl.replay.sequence` or `fnrl.replay.multi`), keywords of its `sample`,
    and whether `buffer` holds vmapped rows' buffers (their index [R, N] is used as is).
    """
    if cuda_graph and not fused:
        raise ValueError("cuda_graph needs the fused learner step (fused=True)")
    if fused:
        return _fused(update, batch_size, prioritized, ahead_of_time and not cuda_graph, cuda_graph)
    options = dict(sample_options or {})

    def learn(state, buffer, beta: float):
        batch = replay.sample(buffer, batch_size, beta=beta, **options)
        state, metrics = update(state, batch)
        if prioritized:
            index = batch["index"][0] if batch["index"].ndim == 2 and not rows else batch["index"]
            buffer = replay.update_priorities(buffer, index, metrics["priority"])
        return state, buffer, metrics

    return learn


def _fused(update: Callable, batch_size: int, prioritized: bool, ahead_of_time: bool,
           cuda_graph: bool = False) -> Callable:
    def step(state, tree, storage, table, max_priority, beta, *, spec):
        batch, _ = row_replay.draw(spec, tree, storage, batch_size, beta)
        new_state, metrics = update(state, batch)
        state.update_(new_state)   # donated: the new state goes into the old one's tensors
        if prioritized:
            row_replay.set_priorities(spec, tree, table, max_priority, batch["index"], metrics["priority"],
                                      dedup=False)
        return metrics

    compiled = compile_with_cpp_wrapper_on_cpu(step, {"fallback_random": True}, fullgraph=True, dynamic=False)
    model = None         # the step as an AOTInductor model (fnrl.accel.aot.AotFunction), built at the first call
    graphed = None       # the compiled step replayed from a CUDA graph (fnrl.accel.cudagraphs), with cuda_graph
    beta_tensor = None   # one 0-d tensor refilled per call (a graph input, so a new beta never recompiles)

    def learn(state, buffer, beta: float):
        nonlocal beta_tensor, model, ahead_of_time, graphed
        if beta_tensor is None:
            beta_tensor = torch.empty((), dtype=buffer.tree.dtype, device=buffer.tree.device)
        beta_tensor.fill_(beta)
        if cuda_graph:
            if graphed is None:
                from fnrl.accel.cudagraphs import GraphedStep

                graphed = GraphedStep(functools.partial(compiled, spec=buffer.spec))
            return state, buffer, graphed(*_parts(state, buffer, beta_tensor))
        if ahead_of_time and aot.serves(buffer.tree.device):
            if model is None:
                model = aot.function_or_none("the learner step is", functools.partial(step, spec=buffer.spec),
                                             _parts(state, buffer, beta_tensor), {"fallback_random": True})
                ahead_of_time = model is not None
            if ahead_of_time:
                return state, buffer, model(*_parts(state, buffer, beta_tensor))
        metrics = compiled(*_parts(state, buffer, beta_tensor), spec=buffer.spec)
        return state, buffer, metrics

    return learn


def _parts(state, buffer, beta: torch.Tensor) -> tuple:
    """The fused step's tensor arguments (its `spec` is static)."""
    return state, buffer.tree, buffer.storage, buffer.rows, buffer.max_priority, beta
