"""The whole rollout as one compiled call, three ways, against the serial sampler, interleaved.

PPO CartPole-v1 policy (64-64 tanh), [128, B] rollouts, timed in alternating rounds in one
process (the host's speed drifts between runs, not between neighbouring rounds):

- `serial + EnvPool`: `fnrl train`'s default path: the serial sampler over EnvPool (EnvPool's
  C++ calls, `fnrl.envs.batched.EnvPoolCalls`), acting through the AOTInductor model
  (`fnrl.accel.aot.AotAct`), the writes and the episode bookkeeping in numpy;
- `alternating + EnvPool`: `fnrl.samplers.alternating`: the envs in two EnvPools of B/2, the
  policy acting on one half while EnvPool's worker steps the other (same model, same
  bookkeeping once per collect as the serial sampler);
- `scan + EnvPool op`: a proposed design: the T steps as one `scan` compiled by AOTInductor,
  EnvPool's step inside it as an opaque operator (`torch.library`, its kernel EnvPool's C++
  `_send` / `_recv`), the policy in the same graph (this script only: the flags and episode
  statistics are left out, so it times less than a sampler would do);
- `graph sampler`: `fnrl.samplers.graph`: the scan with CartPole's dynamics in torch
  (`fnrl.envs.functional`), flags, statistics and the buffer writes included;
- `raw EnvPool`: 128 random-action steps of the same EnvPool envs through the same C++
  calls, no policy (the serial sampler's target: within 1.5x of it);
- `raw functional`: 128 random-action steps of the functional CartPole in the same kind of
  compiled scan, no policy (the graph sampler's own ceiling).

Then whole PPO iterations (collect + the compiled update, on `fnrl.train`'s threads) at
`fnrl train ppo`'s default shapes, CleanRL's and purejaxrl's, serial vs alternating vs graph in
turn, with the same update function and parameters: env steps per second.

    python benchmarks/probes/graph_rollout.py [--rounds 15] [--envs 4,64] [--out benchmarks/probes/graph_rollout.md]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict
from torch._higher_order_ops.scan import scan

from fnrl import envs
from fnrl.algos import ppo
from fnrl.accel.aot import AotAct, AotFunction
from fnrl.envs import functional
from fnrl.samplers import SerialSampler
from fnrl.samplers.alternating import AlternatingSampler
from fnrl.samplers.graph import GraphSampler
from fnrl.accel.compiled import HeldStance
from fnrl.run.threads import intra_op_threads, update_threads_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
T = 128
SETTINGS = dict(env_id="CartPole-v1", num_steps=T, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99,
                gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.2, anneal_clip=False,
                clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64),
                total_steps=10_000_000)

# ------------------------------------------------------------------ EnvPool's step as an opaque operator
_ENVS: dict[int, envs.BatchedEnv] = {}
_LIB = torch.library.Library("fnrlbench", "DEF")
_LIB.define("envpool_step(Tensor action, int handle) -> (Tensor, Tensor, Tensor, Tensor)")


def _envpool_step(action, handle):
    """(obs, reward, terminated, truncated) of EnvPool env `handle` stepped with `action`."""
    obs, reward, terminated, truncated, _ = _ENVS[handle]._calls.step(action.numpy().astype(np.int32))
    return tuple(torch.from_numpy(x) for x in (obs, reward, terminated, truncated))


def _envpool_step_shapes(action, handle):
    b = action.shape[0]
    return (action.new_empty(b, 4, dtype=torch.float32), action.new_empty(b, dtype=torch.float32),
            action.new_empty(b, dtype=torch.bool), action.new_empty(b, dtype=torch.bool))


_LIB.impl("envpool_step", _envpool_step, "CompositeExplicitAutograd")
torch.library.register_fake("fnrlbench::envpool_step", _envpool_step_shapes, lib=_LIB)


class EnvPoolOpRollout:
    """T steps of the policy and EnvPool's step (the operator above) in one AOTInductor scan."""

    def __init__(self, agent, state, env):
        _ENVS[id(env)] = env
        handle = id(env)
        self.obs = env.reset()["obs"].clone()

        def rollout(chosen, obs):
            def body(o, _):
                action, extras, _ = agent.act(chosen, o, None, True)
                next_obs, reward, terminated, truncated = torch.ops.fnrlbench.envpool_step(action, handle)
                return next_obs.clone(), (action, extras["logp"], extras["value"], next_obs, reward,
                                          terminated, truncated)
            last, ys = scan(body, obs, torch.zeros(T))
            obs.copy_(last)
            return ys

        self.chosen = state.select(*ppo.ACT_KEYS, strict=False)
        self.model = AotFunction(rollout, (self.chosen, self.obs))

    def collect(self):
        return self.model(self.chosen, self.obs)


class RandomFunctionalRollout:
    """T random-action steps of a functional env in one AOTInductor scan (rewards kept)."""

    def __init__(self, env):
        self.state = TensorDict(env.reset(), batch_size=[env.num_envs])

        def rollout(state):
            def body(carry, _):
                action = torch.randint(0, 2, (env.num_envs,))
                carry, step = env.step(carry, action)
                return carry, step["reward"].clone()
            last, rewards = scan(body, dict(state.items()), torch.zeros(T))
            for k, v in last.items():
                state[k].copy_(v)
            return rewards

        self.model = AotFunction(rollout, (self.state,))

    def collect(self):
        return self.model(self.state)


# ------------------------------------------------------------------ contenders


def _agent(num_envs: int):
    config = ppo.Config(**SETTINGS, num_envs=num_envs)
    spec = envs.env_spec(config.env_id, num_envs)
    agent = ppo.make(config, spec, compile=False)
    return config, agent, agent.init(0)


def rollout_rounds(num_envs: int, rounds: int) -> dict[str, float]:
    """Median ms per [128, B] rollout of each contender, alternating rounds."""
    config, agent, state = _agent(num_envs)
    act = AotAct(agent.act, ppo.ACT_KEYS, fallback=None)
    serial = SerialSampler(envs.make("CartPole-v1", num_envs, seed=0), act, T)
    graph = GraphSampler(functional.make("CartPole-v1", num_envs, seed=0), act, T)
    alternating = AlternatingSampler(envs.make("CartPole-v1", num_envs, seed=4), AotAct(agent.act, ppo.ACT_KEYS,
                                                                                          fallback=None), T)
    op = EnvPoolOpRollout(agent, state, envs.make("CartPole-v1", num_envs, seed=1))
    raw_env = envs.make("CartPole-v1", num_envs, seed=2)
    raw_env.reset()
    rng = np.random.default_rng(0)

    def raw():
        for a in [rng.integers(0, 2, size=num_envs, dtype=np.int32) for _ in range(T)]:
            raw_env._calls.step(a)

    raw_functional = RandomFunctionalRollout(functional.make("CartPole-v1", num_envs, seed=3))
    contenders = {"serial + EnvPool": lambda: serial.collect(state),
                  "alternating + EnvPool": lambda: alternating.collect(state), "scan + EnvPool op": op.collect,
                  "graph sampler": lambda: graph.collect(state), "raw EnvPool": raw,
                  "raw functional": raw_functional.collect}
    times = {k: [] for k in contenders}
    stance = HeldStance()
    for _ in range(3):   # builds, compiles, warm-up
        for fn in contenders.values():
            fn()
    stance.hold(True)
    try:
        for _ in range(rounds):
            for name, fn in contenders.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
    finally:
        stance.release()
    for e in (serial, alternating, raw_env):
        e.close()
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


ITERATIONS = {
    "`fnrl train ppo`'s default (8 x 32, 20 x 1)": dict(env_id="CartPole-v1"),
    "CleanRL ppo.py (4 x 128, 4 x 4)": dict(SETTINGS, num_envs=4),
    "purejaxrl (64 x 128, 4 x 4)": dict(SETTINGS, num_envs=64),
}
"""PPO settings of the iteration rounds: envs x steps, epochs x minibatches."""


def iteration_rounds(settings: dict, rounds: int) -> tuple[dict[str, float], int]:
    """(median ms per PPO iteration (collect + compiled update) with each sampler, alternating;
    env steps per iteration)."""
    config = ppo.Config(**settings)
    n, steps = config.num_envs, config.num_steps
    spec = envs.env_spec("CartPole-v1", n)
    agent = ppo.make(config, spec, compile=False)
    state = agent.init(0)
    update = ppo.make(config, spec, compile=True).update
    threads = update_threads_for(config, False, 1, 1, False)
    act = AotAct(agent.act, ppo.ACT_KEYS, fallback=None)
    samplers = {"serial + EnvPool": SerialSampler(envs.make("CartPole-v1", n, seed=0), act, steps),
                "alternating + EnvPool": AlternatingSampler(envs.make("CartPole-v1", n, seed=0),
                                                            AotAct(agent.act, ppo.ACT_KEYS, fallback=None), steps),
                "graph sampler": GraphSampler(functional.make("CartPole-v1", n, seed=0), act, steps)}
    states = {k: state.clone() for k in samplers}
    times = {k: [] for k in samplers}
    stance = HeldStance()

    def iteration(name):
        rollout = samplers[name].collect(states[name])
        states[name]["env_steps"].add_(n * steps)
        with intra_op_threads(threads):
            states[name], _ = update(states[name], rollout)

    for _ in range(2):
        for name in samplers:
            iteration(name)
    stance.hold(True)
    try:
        for _ in range(rounds):
            for name in samplers:
                t = time.perf_counter()
                iteration(name)
                times[name].append(time.perf_counter() - t)
    finally:
        stance.release()
    for name in ("serial + EnvPool", "alternating + EnvPool"):
        samplers[name].close()
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}, n * steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--envs", default="4,64")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(x) for x in args.envs.split(",")]
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    lines = ["# The whole rollout as one compiled call", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none (CPU only), torch {torch.__version__} "
             f"(1 intra-op thread for acting), Python {platform.python_version()}. Load average at start: {load}.", "",
             f"Milliseconds per [128, B] rollout, medians of {args.rounds} alternating rounds in one process "
             "(contenders in the script's docstring). Generated by `python benchmarks/probes/graph_rollout.py`.", "",
             "| envs | serial + EnvPool | alternating + EnvPool | scan + EnvPool op | graph sampler | raw EnvPool | "
             "raw functional | serial / raw EnvPool | alternating / raw EnvPool | op scan / serial | graph / serial | "
             "graph / raw EnvPool | graph / raw functional | graph rollout SPS |", "|---:" * 14 + "|"]
    for n in sizes:
        m = rollout_rounds(n, args.rounds)
        s, o, g, r = m["serial + EnvPool"], m["scan + EnvPool op"], m["graph sampler"], m["raw EnvPool"]
        f, a = m["raw functional"], m["alternating + EnvPool"]
        lines.append(f"| {n} | {s:.2f} | {a:.2f} | {o:.2f} | {g:.2f} | {r:.2f} | {f:.2f} | {s / r:.2f}x | "
                     f"{a / r:.2f}x | {o / s:.2f}x | "
                     f"{g / s:.2f}x | {g / r:.2f}x | {g / f:.1f}x | {n * T / g * 1e3:,.0f} |")
        print(lines[-1], flush=True)
    lines += ["", "PPO iterations (collect + compiled update; envs x steps, epochs x minibatches), ms, medians of "
              "alternating rounds, and the env steps per second they give:", "",
              "| settings | serial + EnvPool | alternating + EnvPool | graph sampler | serial SPS | alternating SPS | "
              "graph SPS | alternating / serial | graph / serial |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, settings in ITERATIONS.items():
        m, steps = iteration_rounds(settings, args.rounds)
        s, a, g = m["serial + EnvPool"], m["alternating + EnvPool"], m["graph sampler"]
        lines.append(f"| {name} | {s:.1f} | {a:.1f} | {g:.1f} | {steps / s * 1e3:,.0f} | {steps / a * 1e3:,.0f} | "
                     f"{steps / g * 1e3:,.0f} | {s / a:.2f}x | {s / g:.2f}x |")
        print(lines[-1], flush=True)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    lines += ["", f"Load average at end: {load}; whole run {time.perf_counter() - started:.0f} s.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
