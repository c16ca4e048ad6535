"""Threads and layouts: the A/B measurements behind fnrl's thread defaults and conv layout.

Each comparison runs both sides interleaved in one process (A, B, A, B, ...; the median
of the per-round ratios), so the machine's drift hits both alike:

1. EnvPool threads (`fnrl.envs.envpool_threads`): raw random-action steps per second with
   `num_threads=1` vs EnvPool's default (0: one per core), CartPole 1/4/64 envs, Pong and
   HalfCheetah 8 envs.
2. A PPO CartPole rollout (eager act, serial sampler, 128 steps) with 1 EnvPool thread
   vs the default, 4 and 64 envs.
3. The compiled PPO update (`fnrl.run.threads.update_threads_for`) at 1 vs 2 torch threads:
   CleanRL's 4 envs (128-row minibatches), 32 and 64 envs x 128 (1024 and 2048 rows).
4. A PPO CartPole rollout with the compiled act (`fnrl.accel.aot.AotAct`, as `fnrl train`), serial
   vs alternating sampler, each against 128 random-action steps of the raw envs (the
   rollout target: at most 1.5x raw at 64 envs).
5. The Nature CNN forward + backward (256 frames, as PPO Pong's minibatch) with NCHW vs
   channels-last input (`fnrl.nets.core._ConvTorso`), eager, at `--threads` torch threads.
6. Off-policy updates (`fnrl.run.threads.update_threads_for`): `replay.sample` on 1 thread + the
   compiled update at 1 vs 2 torch threads, as the training loop calls them, on a replay of
   1,000-2,000 steps: DQN CartPole with CleanRL's 120x84 net and with fnrl's default 256x256,
   SAC Pendulum's default (64x64), SAC and TD3 with CleanRL's HalfCheetah settings (256x256),
   DQN Pong (Nature CNN, batch 32).

    python benchmarks/probes/threads.py [--rounds 15] [--only envpool,rollout,update,offpolicy,sampler,conv] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fnrl import envs, samplers
from fnrl.algos import ppo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite
sys.path.insert(0, str(Path(__file__).resolve().parent))       # the other probes
from machine import cpu_model  # noqa: E402
from ppo_breakdown import SETTINGS  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")


def interleaved(sides: dict, rounds: int) -> dict:
    """{name: median seconds per call} and the median per-round ratio of the first side over each other."""
    times = {k: [] for k in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    first = next(iter(sides))
    ratios = {k: statistics.median(a / b for a, b in zip(times[first], times[k])) for k in sides if k != first}
    return {k: statistics.median(v) for k, v in times.items()}, ratios


def raw_envpool(env_id: str, num_envs: int, steps: int, rounds: int) -> str:
    import envpool

    pools = {nt: envpool.make(env_id, env_type="gymnasium", num_envs=num_envs, num_threads=nt) for nt in (0, 1)}
    space = pools[0].action_space
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, space.n, num_envs, dtype=np.int32) if hasattr(space, "n")
               else rng.uniform(-1, 1, (num_envs, *space.shape)).astype(np.float32) for _ in range(64)]
    for pool in pools.values():
        pool.reset()

    def stepper(pool):
        return lambda: [pool.step(actions[i % 64]) for i in range(steps)]

    med, ratio = interleaved({f"nt{nt}": stepper(pool) for nt, pool in pools.items()}, rounds)
    sps = {k: steps * num_envs / v for k, v in med.items()}
    return (f"| raw {env_id}, {num_envs} envs | {sps['nt0']:,.0f} SPS | {sps['nt1']:,.0f} SPS | "
            f"{ratio['nt1']:.2f}x |")


def rollout(num_envs: int, rounds: int) -> str:
    config = ppo.Config(**{**SETTINGS, "num_envs": num_envs})
    sides = {}
    for nt in (0, 1):
        env = envs.make("CartPole-v1", num_envs, seed=0, num_threads=nt)
        agent = ppo.make(config, env.spec)
        state = agent.init(0)
        sampler = samplers.make("serial", env, agent.act, config.num_steps)
        sampler.collect(state)
        sides[f"nt{nt}"] = (lambda s=sampler, st=state: s.collect(st))
    med, ratio = interleaved(sides, rounds)
    return (f"| PPO rollout, CartPole {num_envs} envs x 128 (eager act) | {med['nt0'] * 1e3:.1f} ms | "
            f"{med['nt1'] * 1e3:.1f} ms | {ratio['nt1']:.2f}x |")


def update(num_envs: int, rounds: int) -> str:
    config = ppo.Config(**{**SETTINGS, "num_envs": num_envs})
    env = envs.make("CartPole-v1", num_envs, seed=0)
    agent = ppo.make(config, env.spec, compile=True)
    state = agent.init(0)
    rollout_ = samplers.make("serial", env, agent.act, config.num_steps).collect(state).clone()
    holder = {"state": state}
    for threads in (1, 2, 1):   # compile and warm up
        torch.set_num_threads(threads)
        holder["state"], _ = agent.update(holder["state"], rollout_)

    def at(threads):
        def run():
            torch.set_num_threads(threads)
            holder["state"], _ = agent.update(holder["state"], rollout_)
        return run

    med, ratio = interleaved({"t1": at(1), "t2": at(2)}, rounds)
    torch.set_num_threads(1)
    rows = num_envs * 128 // config.num_minibatches
    return (f"| compiled PPO update, {num_envs} envs x 128 ({rows}-row minibatches) | {med['t1'] * 1e3:.1f} ms | "
            f"{med['t2'] * 1e3:.1f} ms | {ratio['t2']:.2f}x |")


OFF_POLICY = (   # label, algorithm, settings (None: the algorithm's default config)
    ("DQN CartPole, CleanRL's net (batch 128, 120x84)", "dqn", "CARTPOLE_DQN"),
    ("DQN CartPole, fnrl's default (batch 128, 256x256)", "dqn", None),
    ("SAC Pendulum, fnrl's default (batch 256, 64x64)", "sac", None),
    ("SAC HalfCheetah, CleanRL's settings (batch 256, 256x256)", "sac", "HALFCHEETAH_SAC"),
    ("TD3 HalfCheetah, CleanRL's settings (batch 256, 256x256)", "td3", "HALFCHEETAH_SAC"),
    ("DQN Pong (batch 32, Nature CNN)", "dqn", dict(env_id="Pong-v5", buffer_size=10_000, batch_size=32)),
)


def offpolicy_update(label: str, name: str, settings, rounds: int) -> str:
    import dataclasses

    import suite
    from fnrl import algos, replay
    from fnrl.accel.compiled import make_agent
    from fnrl.loops.off_policy import init_replay
    from fnrl.run.threads import intra_op_threads

    module = algos.load(name)
    if settings is None:
        config = algos.default_config(name)
    else:
        settings = getattr(suite, settings) if isinstance(settings, str) else settings
        fields = {f.name for f in dataclasses.fields(module.Config)}
        config = module.Config(**{k: v for k, v in settings.items() if k in fields})
    config = dataclasses.replace(config, num_steps=max(1, 1000 // config.num_envs))
    env = envs.make(config.env_id, config.num_envs, seed=0)
    agent = make_agent(module, config, env.spec, compile=True)
    holder = {"state": agent.init(0)}
    sampler = samplers.make("serial", env, agent.act, config.num_steps)
    buffer = None
    for _ in range(2):
        rollout_ = sampler.collect(holder["state"])
        buffer = buffer or init_replay(config, rollout_, env.spec, "cpu")
        buffer = replay.add(buffer, rollout_, compiled=True)
    sampler.close()

    def at(threads, calls=10):
        def run():
            for _ in range(calls):
                batch = replay.sample(buffer, config.batch_size, compiled=True)
                with intra_op_threads(threads):
                    holder["state"], _ = agent.update(holder["state"], batch)
        return run

    for threads in (1, 2):   # compile (once per thread count) and warm up
        at(threads, 3)()
    med, ratio = interleaved({"t1": at(1), "t2": at(2)}, rounds)
    return (f"| sample + compiled update: {label} | {med['t1'] * 1e2:.2f} ms | {med['t2'] * 1e2:.2f} ms "
            f"| {ratio['t2']:.2f}x |")


def sampler_vs_raw(num_envs: int, rounds: int) -> list[str]:
    from fnrl.accel.aot import AotAct
    from fnrl.accel.compiled import acting_on

    config = ppo.Config(**{**SETTINGS, "num_envs": num_envs})
    sides = {}
    for name in ("serial", "alternating"):
        env = envs.make("CartPole-v1", num_envs, seed=0)
        agent = ppo.make(config, env.spec)
        state = agent.init(0)
        fallback = acting_on(ppo.ACT_KEYS, torch.compile(agent.act, fullgraph=True, dynamic=False,
                                                         options={"cpp_wrapper": True}))
        sampler = samplers.make(name, env, AotAct(agent.act, ppo.ACT_KEYS, fallback), config.num_steps)
        sampler.collect(state)
        sides[name] = (lambda s=sampler, st=state: s.collect(st))
    raw = envs.make("CartPole-v1", num_envs, seed=0).raw
    raw.reset()
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, num_envs, dtype=np.int32) for _ in range(config.num_steps)]
    sides = {"raw": lambda: [raw.step(a) for a in actions], **sides}
    med, ratio = interleaved(sides, rounds)
    return [f"| {name} sampler, compiled act, CartPole {num_envs} envs x 128 | raw {med['raw'] * 1e3:.1f} ms | "
            f"{med[name] * 1e3:.1f} ms | {1 / ratio[name]:.2f}x the raw time |" for name in ("serial", "alternating")]


def conv_layout(rounds: int) -> str:
    from fnrl.nets.core import NatureCNN

    net = NatureCNN()
    frames = torch.rand(256, 4, 84, 84)
    channels_last = frames.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)

    def step(x):
        return lambda: net.net(x).sum().backward()

    step(frames)()
    step(channels_last)()
    med, ratio = interleaved({"nchw": step(frames), "nhwc": step(channels_last)}, rounds)
    return (f"| Nature CNN forward + backward, 256 frames, {torch.get_num_threads()} thread(s) | "
            f"{med['nchw'] * 1e3:.1f} ms | {med['nhwc'] * 1e3:.1f} ms | {ratio['nhwc']:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the conv comparison")
    parser.add_argument("--only", default="envpool,rollout,update,offpolicy,sampler,conv",
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    only = set(args.only.split(","))
    t0, load = time.perf_counter(), "/".join(f"{x:.2f}" for x in os.getloadavg())
    r = args.rounds
    lines = ["# Threads and layouts: interleaved A/B", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none (CPU only), torch {torch.__version__}. "
             f"Load average at start: {load}.", "",
             "Both sides of a row run interleaved in one process; `B vs A` is the median over rounds of "
             "A's time / B's time (above 1: B is faster). Generated by `python benchmarks/probes/threads.py`.", "",
             "| what | A | B | B vs A |", "|---|---:|---:|---:|"]
    torch.set_num_threads(1)
    if "envpool" in only:
        lines.append("| **EnvPool threads: A = EnvPool's default (one per core), B = 1 thread** | | | |")
        for env_id, n, steps in (("CartPole-v1", 1, 500), ("CartPole-v1", 4, 500), ("CartPole-v1", 64, 500),
                                 ("Pong-v5", 8, 20), ("HalfCheetah-v4", 8, 100)):
            lines.append(raw_envpool(env_id, n, steps, 2 * r))
    if "rollout" in only:
        for n in (4, 64):
            lines.append(rollout(n, r))
    if "update" in only:
        lines.append("| **torch threads of the update: A = 1, B = 2** | | | |")
        for n in (4, 32, 64):
            lines.append(update(n, r))
    if "offpolicy" in only:
        lines.append("| **torch threads of an off-policy update: A = 1, B = 2 (ms per sample + update)** | | | |")
        for label, name, settings in OFF_POLICY:
            lines.append(offpolicy_update(label, name, settings, r))
            torch.set_num_threads(1)
    if "sampler" in only:
        lines.append("| **rollout vs raw EnvPool: A = 128 random-action steps, B = a PPO rollout** | | | |")
        for n in (4, 64):
            lines += sampler_vs_raw(n, r)
    if "conv" in only:
        lines.append("| **conv input layout: A = NCHW, B = channels-last** | | | |")
        torch.set_num_threads(args.threads)
        lines.append(conv_layout(max(3, r // 3)))
    lines += ["", f"Load average at end: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}; "
              f"whole run {time.perf_counter() - t0:.0f} s."]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
