"""CUDA-graph capture of a step whose tensors stay where they are: `GraphedStep`.

    graphed = GraphedStep(step)            # step(*args) -> tensor, dict of tensors or None
    out = graphed(state, buffer, beta)     # calls 1-2: eager warm-up; 3: capture; then replays

On a GPU a small update is launch-bound: each of its hundreds of kernels costs a few µs
to launch from the host, more than its arithmetic. A CUDA graph records the kernels of
one call and replays them all with one launch. Replaying reads and writes the memory
the recorded call used, so the step must:

- take tensors (and TensorDicts of them) that keep their storage from call to call: a
  donated state (the step writes its new values into the old tensors, as the fused
  off-policy learner does, `fnrl.learner`), a replay buffer written in place, and every
  changing scalar as a 0-d tensor refilled before the call (a learning rate, beta);
- have static shapes, no host synchronization (`.item()`, a Python branch on a tensor)
  and no CPU tensors;
- draw its random numbers from the CUDA generator (a graph advances it as eager would).

Its outputs are the graph's own tensors, rewritten by every replay: read (or clone) them
before the next call. A call whose tensors moved (another state, a rebuilt buffer) raises
`GraphInputsMoved` instead of replaying over memory that may no longer be the step's.
The first `warmup` calls run the step eagerly on a side stream, as CUDA needs before a
capture (cuBLAS workspaces, Triton autotuning, a compiled step's first compile).

`fnrl train --cuda-graphs` uses it for the off-policy learner step (`fnrl.learner`) and,
through `GraphedUpdate` and `GraphedAct`, for PPO's / A2C's update and acting step
(`graphed_on_policy`). On an H200 (`benchmarks/gpu_graphs.md`) PPO's 64 x 128 update took
2.6 instead of 19.6 ms and an act 82 instead of 267 µs.
"""
from __future__ import annotations

from typing import Callable

import torch
from tensordict import TensorDictBase

from fnrl.errors import ConfigError


class GraphInputsMoved(RuntimeError):
    """A graphed step was called with tensors at other addresses than the ones it captured."""


def leaves(args: tuple) -> list[torch.Tensor]:
    """The tensors of `args` (tensors and TensorDicts), in order."""
    out = []
    for a in args:
        if isinstance(a, TensorDictBase):
            out.extend(a.values(include_nested=True, leaves_only=True))
        elif torch.is_tensor(a):
            out.append(a)
        else:
            raise TypeError(f"a graphed step takes tensors and TensorDicts, got {type(a).__name__}")
    return out


class GraphedStep:
    """`step(*args)` replayed from one CUDA graph (module docstring).

    step: the function to capture (eager or `torch.compile`d), returning a tensor, a dict /
        TensorDict of tensors, or None.
    warmup: eager calls before the capture (at least 1).
    graph: the graph factory, `torch.cuda.CUDAGraph` (tests pass a stand-in to check the
        bookkeeping on a machine without a GPU); `capture(graph)` the context that records
        into it, `torch.cuda.graph` by default.
    """

    def __init__(self, step: Callable, warmup: int = 2, graph: Callable | None = None,
                 capture: Callable | None = None):
        if warmup < 1:
            raise ValueError(f"warmup must be at least 1, got {warmup}")
        self.step, self.warmup = step, warmup
        self._graph_type = graph or torch.cuda.CUDAGraph
        self._capture = capture or torch.cuda.graph
        self._stream = None   # the warm-up's side stream, made at the first CUDA warm-up
        self.calls = 0
        self.graph = None
        self.out = None
        self._addresses: list[int] = []

    def __call__(self, *args):
        tensors = leaves(args)
        self.calls += 1
        if self.graph is None and self.calls <= self.warmup:
            return self._eager(args, tensors)
        if self.graph is None:
            self.graph = self._graph_type()
            with self._capture(self.graph):
                self.out = self.step(*args)
            self._addresses = [t.data_ptr() for t in tensors]
        elif [t.data_ptr() for t in tensors] != self._addresses:
            raise GraphInputsMoved("a graphed step was called with tensors other than the ones it captured "
                                   "(a new state or buffer); make a new GraphedStep for them")
        self.graph.replay()   # the capture records without running: the capturing call replays too
        return self.out

    def _eager(self, args, tensors):
        """A warm-up call: on a side stream where the tensors are CUDA's (as capturing needs)."""
        if not any(t.is_cuda for t in tensors):
            return self.step(*args)
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = self.step(*args)
        torch.cuda.current_stream().wait_stream(stream)
        return out


class GraphedUpdate:
    """An on-policy `update(state, rollout) -> (state, metrics)` replayed from one CUDA graph.

    The state is donated: each call writes the new state into the tensors of the state passed
    in and returns that same TensorDict, so the next call (and the acting step, `GraphedAct`)
    finds it where the graph left it. The rollout is the sampler's preallocated buffer. An
    update that draws its minibatch order on the host (PPO: `update.minibatch_order(state,
    device)`, from the seed and env steps) gets it copied into one fixed tensor before each
    replay and passed as `update(state, rollout, perms=...)`. Metrics: the graph's own tensors.
    """

    def __init__(self, update: Callable, warmup: int = 2, graph: Callable | None = None,
                 capture: Callable | None = None):
        self.update = update
        self.order = getattr(update, "minibatch_order", None)
        self.perms = None
        self.graphed = GraphedStep(self._donated, warmup, graph, capture)

    def _donated(self, state, rollout, *perms):
        new_state, metrics = self.update(state, rollout, **({"perms": perms[0]} if perms else {}))
        state.update_(new_state)
        return metrics

    def __call__(self, state, rollout):
        if self.order is None:
            return state, self.graphed(state, rollout)
        perms = self.order(state, state["env_steps"].device)
        if self.perms is None:
            self.perms = perms
        else:
            self.perms.copy_(perms)
        return state, self.graphed(state, rollout, self.perms)


class GraphedAct:
    """A feed-forward policy's exploring `act(state, obs, None, True)` replayed from a CUDA graph.

    The observation is copied into one fixed buffer, the state is reduced to `keys` (the
    tensors `act` reads, which a donated update keeps in place; None: all of it), and the
    action and extras come back as the graph's own tensors (the sampler writes them into the
    rollout before the next step). Other calls (a carry, explore=False) go to `act` itself.
    """

    def __init__(self, act: Callable, keys=None, warmup: int = 2, graph: Callable | None = None,
                 capture: Callable | None = None):
        self.act, self.keys = act, None if keys is None else tuple(keys)
        self.obs = None
        self.graphed = GraphedStep(self._exploring, warmup, graph, capture)

    def _exploring(self, state, obs):
        action, extras, _ = self.act(state, obs, None, True)
        return {"action": action, **extras}

    def __call__(self, state, obs, carry=None, explore: bool = True):
        if carry is not None or not explore:
            return self.act(state, obs, carry, explore)
        if self.obs is None:
            self.obs = obs.clone()
        else:
            self.obs.copy_(obs)
        selected = state if self.keys is None else state.select(*self.keys, strict=False)
        out = dict(self.graphed(selected, self.obs))
        return out.pop("action"), out, None


def check_cuda_graphs(cuda_graphs: bool, *, device: str, compile: bool, algo: str, off_policy: bool,
                      sampler: str = "serial", fused_learner: bool | None = None, central: bool = False,
                      single: bool | None = None) -> None:
    """One-line errors for `--cuda-graphs` where it does not apply (before any work starts).

    off_policy: the fused learner step is graphed (`fused_learner` None: not known yet,
    checked again once the env is made); on-policy: the update and the acting step (one seed
    in one process, `single` None: not known yet). central: an IMPALA-style learner."""
    if not cuda_graphs:
        return
    if not str(device).startswith("cuda"):
        raise ConfigError(f"--cuda-graphs captures CUDA work: add --device cuda (got --device {device}), "
                          "or drop --cuda-graphs")
    if not compile:
        raise ConfigError("--cuda-graphs captures the compiled steps: drop --no-compile")
    if central:
        raise ConfigError(f"--cuda-graphs captures the serial loop's steps; {algo}'s learner takes its batches "
                          "from actor processes: drop --cuda-graphs")
    if off_policy and sampler == "async":
        raise ConfigError("--cuda-graphs captures the serial loop's learner step, not --sampler async's learner "
                          "process: drop one of them")
    if not off_policy and sampler != "serial":
        raise ConfigError(f"--cuda-graphs captures the serial sampler's acting step, not --sampler {sampler}'s: "
                          "drop one of them")
    if off_policy and fused_learner is False:
        raise ConfigError("--cuda-graphs captures the fused learner step, used for one seed with a row replay "
                          "without frame deduplication (not --num-seeds / --sweep, sequence replay or Atari "
                          "frame stacks): drop --cuda-graphs")
    if not off_policy and single is False:
        raise ConfigError(f"--cuda-graphs captures one seed's {algo} update in one process "
                          "(not --num-seeds / --sweep / --nproc): drop --cuda-graphs")


def graphed_on_policy(agent, keys, recurrent: bool):
    """`agent` (compiled, its state on a GPU) with its update replayed from a CUDA graph
    (`GraphedUpdate`, the state donated) and, for a feed-forward policy, its exploring act
    (`GraphedAct` over `keys`, the state `act` reads; None: the whole state)."""
    act = agent.act if recurrent else GraphedAct(agent.act, keys)
    return agent._replace(update=GraphedUpdate(agent.update), act=act)
