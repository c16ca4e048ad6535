"""DQN throughput on CartPole-v1: fnrl (compiled and eager) vs stable-baselines3, one run, one machine.

Settings are CleanRL dqn.py's (lr 2.5e-4 Adam, buffer 10k, learning_starts 10k, batch 128,
train_freq 10 = one update every 10 env steps = `replay_ratio=0.1`, target network copied every
500 env steps = 50 updates, gamma 0.99, epsilon 1 -> 0.05, MLP [120, 84] ReLU, squared TD loss,
no gradient clipping, 1 env, 100k env steps). fnrl collects 10 steps of its one env, then
makes the one update due (`num_steps=10`), as CleanRL does. Differences that do not move the
throughput: fnrl ramps epsilon from learning_starts (rlpyt) to 50k steps, CleanRL from step 0;
SB3 uses its Huber loss and its default gradient clip 10.

Measured, side by side in one process:
1. env steps per second of the whole 100k-step run (incl. fnrl's compile time) and in steady
   state (the last 50k steps, from progress.csv or SB3's clock), final mean return;
2. where one env step's time goes in fnrl at this shape (1 env): `act` (eager and compiled),
   the env adaptor's `step` and EnvPool's own step, the sampler's writes, `replay.add` of a
   10-step rollout, `replay.sample(128)`, and one `update` (eager and compiled), each the median
   of many calls; the sum is the cost of 10 env steps + 1 update.

Writes benchmarks/probes/dqn_cartpole.md.

    python benchmarks/probes/dqn_cartpole.py [--threads 1] [--steps 100000] [--skip-sb3]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fnrl import envs, replay
from fnrl.algos import dqn
from fnrl.samplers import SerialSampler
from fnrl.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
CLEANRL = dict(env_id="CartPole-v1", total_steps=100_000, num_envs=1, num_steps=10, buffer_size=10_000,
               batch_size=128, learning_starts=10_000, replay_ratio=0.1, n_step=1, gamma=0.99, optimizer="adam",
               learning_rate=2.5e-4, optimizer_eps=1e-8, max_grad_norm=0.0, huber_delta=0.0,
               target_update_interval=50, tau=1.0, eps_init=1.0, eps_final=0.05, eps_steps=50_000,
               hidden=(120, 84), activation="relu")
PEERS = {"CleanRL dqn.py": "3,619 / 3,483", "stable-baselines3 DQN": "2,594 / 2,517"}  # measured earlier on this kind of machine


def machine() -> str:
    cpu = cpu_model()
    import envpool
    import tensordict
    try:
        import stable_baselines3
        sb3 = stable_baselines3.__version__
    except ImportError:
        sb3 = "not installed"
    return (f"nproc={os.cpu_count()}, CPU: {cpu}, GPU: none used, torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op threads), tensordict {tensordict.__version__}, envpool "
            f"{envpool.__version__}, stable-baselines3 {sb3}, Python {platform.python_version()}")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------
# whole training runs
# ---------------------------------------------------------------------------


def fnrl_run(config: dqn.Config, compile: bool, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train("dqn", config, seed=1, log_dir=Path(tmp) / "run", compile=compile, quiet=True,
                       tensorboard=False, plot=False, threads=threads, checkpoint_every=config.total_steps)
        total = time.perf_counter() - t0
    rows = result.history
    half = config.total_steps // 2
    base = max((r for r in rows if r["env_steps"] <= half), key=lambda r: r["env_steps"])
    last = rows[-1]
    returns = [r["return_mean"] for r in rows if np.isfinite(r["return_mean"])]
    return {"wall": total, "sps_all": last["env_steps"] / total,
            "sps_steady": (last["env_steps"] - base["env_steps"]) / (last["wall_s"] - base["wall_s"]),
            "return": returns[-1] if returns else float("nan"), "load": load()}


def sb3_run(total_steps: int) -> dict:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.marks = []

        def _on_step(self) -> bool:
            if self.num_timesteps % 1000 == 0:
                self.marks.append((self.num_timesteps, time.perf_counter()))
            return True

    env = make_vec_env("CartPole-v1", n_envs=1, seed=1)
    model = DQN("MlpPolicy", env, learning_rate=2.5e-4, buffer_size=10_000, learning_starts=10_000, batch_size=128,
                tau=1.0, gamma=0.99, train_freq=10, gradient_steps=1, target_update_interval=500,
                exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                policy_kwargs=dict(net_arch=[120, 84]), device="cpu", seed=1, verbose=0)
    clock = Clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=total_steps, callback=clock)
    total = time.perf_counter() - t0
    base_steps, base_t = max((m for m in clock.marks if m[0] <= total_steps // 2), key=lambda m: m[0])
    returns = [ep["r"] for ep in model.ep_info_buffer]
    env.close()
    return {"wall": total, "sps_all": model.num_timesteps / total,
            "sps_steady": (model.num_timesteps - base_steps) / (t0 + total - base_t),
            "return": float(np.mean(returns)) if returns else float("nan"), "load": load()}


# ---------------------------------------------------------------------------
# per-step breakdown
# ---------------------------------------------------------------------------


def median_us(fn, reps: int) -> float:
    for _ in range(min(20, reps)):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def breakdown(config: dqn.Config, reps: int) -> list[tuple[str, float, str]]:
    """Median microseconds of each piece of fnrl's loop at this shape."""
    env = envs.make(config.env_id, num_envs=config.num_envs, seed=0)
    agent = dqn.make(config, env.spec)
    state = agent.init(0)
    obs = env.reset()["obs"]
    rows = []
    act_eager = median_us(lambda: agent.act(state, obs, None, True), reps)
    # fnrl.train acts through fnrl.accel.aot.AotAct; this is its torch.compile fallback
    compiled_act = torch.compile(agent.act, fullgraph=True, options={"fallback_random": True})
    act_compiled = median_us(lambda: compiled_act(state, obs, None, True), reps)
    action = agent.act(state, obs, None, True)[0]
    step = median_us(lambda: env.step(action), reps)
    raw_action = action.numpy().astype(np.int32)
    raw = median_us(lambda: env.raw.step(raw_action), reps)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    collect = median_us(lambda: sampler.collect(state), max(10, reps // config.num_steps))
    rollout = sampler.collect(state)
    buffer = replay.init(rollout, config.buffer_size, n_step=config.n_step, gamma=config.gamma)
    for _ in range(config.buffer_size // config.num_steps):
        buffer = replay.add(buffer, rollout)
    add = median_us(lambda: replay.add(buffer, rollout), reps)
    sample = median_us(lambda: replay.sample(buffer, config.batch_size), reps)
    replay.sample(buffer, config.batch_size, compiled=True)
    sample_compiled = median_us(lambda: replay.sample(buffer, config.batch_size, compiled=True), reps)
    batch = replay.sample(buffer, config.batch_size)
    update_eager = median_us(lambda: agent.update(state, batch), max(10, reps // 4))
    compiled_update = torch.compile(agent.update, fullgraph=True)
    update_compiled = median_us(lambda: compiled_update(state, batch), reps)
    env.close()
    T = config.num_steps
    sampler_own = collect / T - act_eager - step
    rows += [
        ("act, eager (Q-network forward + epsilon-greedy)", act_eager, "per env step"),
        ("act, torch.compile(fullgraph)", act_compiled, "per env step"),
        ("env adaptor step (EnvPool + numpy->torch + flags)", step, "per env step"),
        ("  of which EnvPool's own step", raw, "per env step"),
        ("sampler's own writes (collect / T - act - step)", sampler_own, "per env step"),
        (f"replay.add of a [{T}, 1] rollout", add, f"per {T} env steps"),
        (f"replay.sample({config.batch_size})", sample, "per update"),
        (f"replay.sample({config.batch_size}, compiled=True)", sample_compiled, "per update"),
        ("update, eager", update_eager, "per update"),
        ("update, compiled", update_compiled, "per update"),
    ]
    per_update_steps = round(1 / config.replay_ratio)
    eager_cycle = per_update_steps * (act_eager + step + sampler_own) + add + sample + update_eager
    compiled_cycle = per_update_steps * (act_compiled + step + sampler_own) + add + sample_compiled + update_compiled
    rows += [
        (f"=> {per_update_steps} env steps + 1 update, eager (SPS {per_update_steps / eager_cycle * 1e6:,.0f})",
         eager_cycle, "per cycle"),
        (f"=> {per_update_steps} env steps + 1 update, compiled act, sample, update (SPS "
         f"{per_update_steps / compiled_cycle * 1e6:,.0f})", compiled_cycle, "per cycle"),
    ]
    return rows


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = dataclasses.replace(dqn.Config(), **{**CLEANRL, "total_steps": args.steps})

    runs = {}
    runs["fnrl compiled"] = fnrl_run(config, True, args.threads)
    print("fnrl compiled", runs["fnrl compiled"], flush=True)
    runs["fnrl eager"] = fnrl_run(config, False, args.threads)
    print("fnrl eager", runs["fnrl eager"], flush=True)
    if not args.skip_sb3:
        torch.set_num_threads(args.threads)
        runs["stable-baselines3 DQN"] = sb3_run(args.steps)
        print("sb3", runs["stable-baselines3 DQN"], flush=True)
    torch.set_num_threads(args.threads)
    parts = breakdown(config, args.reps)

    sb3 = runs.get("stable-baselines3 DQN")
    lines = ["# DQN throughput on CartPole-v1: fnrl vs stable-baselines3", "",
             f"Machine: {machine()}. Measured {time.strftime('%Y-%m-%d %H:%M')}; the machine is shared, load "
             f"averages (1/5/15 min) are given per row.", "",
             f"Settings (CleanRL dqn.py): {args.steps:,} env steps, 1 env, lr 2.5e-4, buffer 10k, learning_starts "
             "10k, batch 128, one update per 10 env steps, target copy every 500 env steps, MLP [120, 84]. "
             "SPS = env steps per second, updates included. `steady` = the last half of the run.", "",
             "| run | wall s | SPS incl. compile | SPS steady | final return | load | vs SB3 (incl. / steady) |",
             "|---|---:|---:|---:|---:|---|---|"]
    for name, r in runs.items():
        ratio = "–" if sb3 is None or name == "stable-baselines3 DQN" else \
            f"{r['sps_all'] / sb3['sps_all']:.2f}x / {r['sps_steady'] / sb3['sps_steady']:.2f}x"
        lines.append(f"| {name} | {r['wall']:.1f} | {r['sps_all']:,.0f} | {r['sps_steady']:,.0f} | "
                     f"{r['return']:.1f} | {r['load']} | {ratio} |")
    lines += ["", "Peers measured earlier on this kind of machine (SPS run 1 / run 2): "
              + "; ".join(f"{k} {v}" for k, v in PEERS.items()) + ".", "",
              "## Where fnrl's time goes (1 env, median of repeated calls)", "",
              "| piece | µs | unit |", "|---|---:|---|"]
    lines += [f"| {name} | {us:,.0f} | {unit} |" for name, us, unit in parts]
    lines += ["", "Generated by `python benchmarks/probes/dqn_cartpole.py`."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
