"""The rollout ceiling: a [128, B] CartPole rollout with the PPO policy vs random-action steps.

Contenders, built side by side in one process and timed in alternating rounds (the host's speed
drifts between runs, not between neighbouring rounds), acting on 1 torch thread:

- `serial (fnrl train)`: the serial sampler over EnvPool as `fnrl train ppo` runs it:
  the AOTInductor act without the critic (PPO evaluates the values of the whole
  rollout in its update) and `EnvPoolCalls` polling the clock before EnvPool's recv;
- `serial, value + sleep (earlier)`: the sampler the earlier way: the act recording
  the critic's value every step, EnvPool's recv called at once (it sleeps until the step is
  posted);
- `serial, value + poll` and `serial, no value + sleep`: each change alone;
- `EnvPool step`: random actions through EnvPool's own gymnasium `step` (the ceiling that
  comparisons with peers quote as "Raw EnvPool, random actions, no policy");
- `fnrl calls, sleep` / `fnrl calls, poll`: random actions through fnrl's direct C++ calls
  (`fnrl.envs.batched.EnvPoolCalls`, no Python wrapper), without and with polling: a stricter
  ceiling than EnvPool's own step, since it leaves out the wrapper's Python.

All EnvPool envs here have 1 worker thread (fnrl's default for classic control).

Then whole PPO iterations (collect + compiled update; purejaxrl's shapes, 64 envs x 128 steps,
4 epochs x 4 minibatches) with a polling and a sleeping env, the update on 1 and on 2 torch
threads (`fnrl train` gives this update 2 and then turns polling off, `fnrl.train`), in
alternating blocks of 3 iterations. Writes benchmarks/probes/env_wait.md (or --out).

    python benchmarks/probes/env_wait.py [--rounds 21] [--envs 8,64] [--blocks 8]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import envpool
import numpy as np
import torch

from fnrl import envs
from fnrl.algos import common, ppo
from fnrl.accel.aot import AotAct
from fnrl.samplers import SerialSampler
from fnrl.accel.compiled import HeldStance
from fnrl.run.threads import intra_op_threads

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model, prepend_report  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
T = 128
ENV = "CartPole-v1"


def contenders(num_envs: int) -> tuple[dict, list]:
    """name -> a call that collects or steps [T, num_envs] once; and what to close."""
    config = ppo.Config(env_id=ENV, num_envs=num_envs, num_steps=T, hidden=(64, 64), total_steps=10_000_000)
    spec = envs.env_spec(ENV, num_envs)
    agent = ppo.make(config, spec)
    state = agent.init(0)
    _, policy = common.actor_critic_policy(spec, config.hidden, config.activation)

    def act_with_value(state, obs, carry, explore=True):   # the earlier act
        action, extras, carry = agent.act(state, obs, carry, explore)
        return action, {**extras, "value": policy(state["params"], obs)[1]}, carry

    lean, valued = (AotAct(f, ppo.ACT_KEYS, fallback=None) for f in (agent.act, act_with_value))

    def env(seed: int, poll: bool) -> envs.BatchedEnv:
        e = envs.make(ENV, num_envs, seed=seed, backend="envpool")
        e._calls.poll = poll
        return e

    samplers = {"serial (fnrl train)": SerialSampler(env(0, True), lean, T),
                "serial, value + sleep (earlier)": SerialSampler(env(0, False), valued, T),
                "serial, value + poll": SerialSampler(env(0, True), valued, T),
                "serial, no value + sleep": SerialSampler(env(0, False), lean, T)}
    rng = np.random.default_rng(0)

    def random_steps(step):
        def run():
            for action in [rng.integers(0, 2, size=num_envs, dtype=np.int32) for _ in range(T)]:
                step(action)
        return run

    wrapped = envpool.make(ENV, env_type="gymnasium", num_envs=num_envs, seed=1, num_threads=1)
    wrapped.reset()
    sleeping, polling = env(2, False), env(2, True)
    for e in (sleeping, polling):
        e.reset()
    runs = {name: (lambda s=s: s.collect(state)) for name, s in samplers.items()}
    runs.update({"EnvPool step": random_steps(wrapped.step), "fnrl calls, sleep": random_steps(sleeping._calls.step),
                 "fnrl calls, poll": random_steps(polling._calls.step)})
    return runs, [*samplers.values(), sleeping, polling, wrapped]


def rounds(num_envs: int, n: int) -> dict[str, float]:
    """Median microseconds per env step (all envs) of each contender over n alternating rounds."""
    runs, owned = contenders(num_envs)
    stance = HeldStance()
    for _ in range(3):   # builds (AOTInductor compiles or cache loads) and warm-up
        for run in runs.values():
            run()
    times = {k: [] for k in runs}
    stance.hold(True)
    try:
        for _ in range(n):
            for name, run in runs.items():
                t = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t)
    finally:
        stance.release()
    for x in owned:
        x.close()
    return {k: statistics.median(v) * 1e6 / T for k, v in times.items()}


def iterations(update_threads: int, blocks: int) -> dict[str, tuple[float, float]]:
    """{"poll" | "sleep": (median ms per collect, per update)} of 64-env PPO iterations."""
    B = 64
    config = ppo.Config(env_id=ENV, num_envs=B, num_steps=T, learning_rate=2.5e-4, num_minibatches=4,
                        update_epochs=4, clip_vloss=True, ent_coef=0.01, gamma=0.99, gae_lambda=0.95,
                        hidden=(64, 64), total_steps=10_000_000)
    agent = ppo.make(config, envs.env_spec(ENV, B), compile=True)
    act = AotAct(agent.act, ppo.ACT_KEYS, fallback=None)
    samplers = {}
    for poll in (True, False):
        env = envs.make(ENV, B, seed=0, backend="envpool")
        env.poll = poll
        samplers["poll" if poll else "sleep"] = SerialSampler(env, act, T)
    states = {k: agent.init(0) for k in samplers}
    times = {k: ([], []) for k in samplers}

    def iteration(name):
        t = time.perf_counter()
        rollout = samplers[name].collect(states[name])
        states[name]["env_steps"].add_(B * T)
        collected = time.perf_counter()
        with intra_op_threads(update_threads):
            states[name], _ = agent.update(states[name], rollout)
        return collected - t, time.perf_counter() - collected

    for _ in range(2):
        for name in samplers:
            iteration(name)
    stance = HeldStance()
    stance.hold(True)
    try:
        for _ in range(blocks):
            for name in samplers:
                for _ in range(3):
                    for kept, took in zip(times[name], iteration(name)):
                        kept.append(took)
    finally:
        stance.release()
    for sampler in samplers.values():
        sampler.close()
    return {k: (statistics.median(c) * 1e3, statistics.median(u) * 1e3) for k, (c, u) in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--envs", default="8,64")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.perf_counter()
    results = {int(b): rounds(int(b), args.rounds) for b in args.envs.split(",")}
    names = list(next(iter(results.values())))
    lines = ["# A rollout with the policy vs random-action steps (the rollout ceiling)", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none (CPU only), torch {torch.__version__} "
             f"(1 intra-op thread), Python {platform.python_version()}, EnvPool 1 worker thread. "
             f"Load average at start: {load}; the rollout rounds took {time.perf_counter() - started:.0f} s.", "",
             f"Microseconds per step of all B envs, medians of {args.rounds} alternating rounds of [{T}, B] in one "
             "process (contenders in the script's docstring). Generated by `python benchmarks/probes/env_wait.py`.", "",
             "| contender | " + " | ".join(f"B={b} µs" for b in results) + " | "
             + " | ".join(f"B={b} / EnvPool step" for b in results) + " | "
             + " | ".join(f"B={b} / fnrl calls, poll" for b in results) + " |",
             "|---" + "|---:" * (3 * len(results)) + "|"]
    for name in names:
        cells = [f"{r[name]:.1f}" for r in results.values()]
        cells += [f"{r[name] / r['EnvPool step']:.2f}x" for r in results.values()]
        cells += [f"{r[name] / r['fnrl calls, poll']:.2f}x" for r in results.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"PPO iterations at 64 envs x {T} (4 epochs x 4 minibatches), medians over {args.blocks} alternating "
              "blocks of 3 iterations:", "",
              "| update threads | env | collect ms | update ms | SPS | collect, poll / sleep |", "|---:|---|---:|---:|---:|---:|"]
    for threads in (1, 2):
        measured = iterations(threads, args.blocks)
        for name, (c, u) in measured.items():
            ratio = f"{measured['poll'][0] / measured['sleep'][0]:.2f}x" if name == "poll" else ""
            lines.append(f"| {threads} | {name} | {c:.1f} | {u:.1f} | {64 * T / (c + u) * 1e3:,.0f} | {ratio} |")
    prepend_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
