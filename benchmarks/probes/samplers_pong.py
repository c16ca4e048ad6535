"""Sampler throughput: serial, alternating and parallel samplers next to the raw EnvPool ceiling.

One run, side by side, on one machine (described at the top of the output). Two cases:

1. PPO on Pong-v5 at CleanRL's ppo_atari_envpool.py settings (8 envs x 128 steps, Nature
   CNN, 4 epochs x 4 minibatches): a policy whose inference costs about as much as the
   env step, or more.
2. Pong-v5, 8 envs x 128 steps, with a near-free policy (uniform random actions and zero
   log-probs / values, written like PPO's): a policy whose inference is cheaper than the env
   step, the target (the best sampler within 80% of the raw EnvPool ceiling). This
   row is the samplers' own overhead: the env adaptor, the rollout writes, the processes.
3. PPO's 64-64 MLP on CartPole-v1 with 64 envs x 128 steps (a fast env: there the eager
   MLP costs more than the env step).

What is measured (rollout only, plus the update measured once):
- collect: env steps per second of `sampler.collect(state)` (a [T, B] rollout with the
  PPO policy sampling actions, log-probs and values), the median over `--rounds` rounds.
  Every sampler is built once and the rounds interleave them (round r times one collect
  of each sampler, then the raw ceiling), so load changes hit all of them alike;
- raw EnvPool: random-action steps per second of the same envs (`envpool.make` with
  fnrl's settings, numpy actions, no policy, no adaptor), timed for the same T steps;
- PPO: one PPO update on a collected rollout, timed once after a warm-up update, and
  "PPO steps/s" = T B / (collect time + update time): the training loop's throughput
  without logging and checkpoints.

The policy acts eagerly unless `--compile-act` (then serial and alternating use
`torch.compile(act)`; parallel workers always act eagerly, on the CPU). With `--device cuda`
the serial and alternating samplers act on the GPU (batched central inference) and the
update runs there; parallel workers act on the CPU and their rollout is copied over.

    python benchmarks/probes/samplers_pong.py [--device cpu|cuda] [--workers W] [--rounds 3] [--threads 1] [--compile-act]

Writes benchmarks/probes/samplers_pong.md (or --out). About 5 min on a busy 2-core machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fnrl import envs, samplers
from fnrl.algos import ppo
from fnrl.samplers.parallel import default_workers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")

PONG = ppo.Config(env_id="Pong-v5", num_envs=8, num_steps=128, learning_rate=2.5e-4, gamma=0.99, gae_lambda=0.95,
                  num_minibatches=4, update_epochs=4, clip_coef=0.1, anneal_clip=False, clip_vloss=True,
                  ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, conv="nature")
CARTPOLE = ppo.Config(env_id="CartPole-v1", num_envs=64, num_steps=128, learning_rate=2.5e-4, gamma=0.99,
                      gae_lambda=0.95, num_minibatches=4, update_epochs=4, hidden=(64, 64), activation="tanh")
SAMPLERS = ("serial", "alternating", "parallel")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    import envpool

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)"
    return (f"nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: {gpu}, torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op threads), envpool {envpool.__version__}, "
            f"Python {platform.python_version()}")


def raw_collect(raw, num_envs: int, n_actions: int, T: int, rng) -> float:
    """Seconds for T random-action steps of the raw EnvPool env."""
    t0 = time.perf_counter()
    for _ in range(T):
        raw.step(rng.integers(0, n_actions, size=num_envs, dtype=np.int32))
    return time.perf_counter() - t0


class RandomAct:
    """A near-free policy: uniform random actions, zero log-probs and values (picklable)."""

    def __init__(self, num_actions: int):
        self.num_actions = num_actions

    def __call__(self, state, obs, carry, explore=True):
        n = obs.shape[0]
        action = torch.randint(self.num_actions, (n,), device=obs.device)
        zeros = torch.zeros(n, device=obs.device)
        return action, {"logp": zeros, "value": zeros}, None


def measure(config: ppo.Config, args, cheap: bool = False) -> dict:
    """Collect times of every sampler and of the raw env (interleaved rounds) and one update time
    (none for the near-free policy, `cheap`)."""
    device = torch.device(args.device)
    spec = envs.env_spec(config.env_id)
    T, B = config.num_steps, config.num_envs
    agent = ppo.make(config, dataclasses.replace(spec, num_envs=B))
    state = agent.init(0).to(device)
    act = torch.compile(agent.act, fullgraph=True) if args.compile_act else agent.act
    if cheap:
        act, state = RandomAct(spec.num_actions), None
    workers = args.workers or default_workers(B)
    built = {}
    for name in SAMPLERS:
        options = {"workers": workers, "agent": None if cheap else ("ppo", config)} if name == "parallel" else {}
        env = envs.make(config.env_id, B, seed=1)
        built[name] = samplers.make(name, env, act, T, device=device, **options)
    raw_env = envs.make(config.env_id, B, seed=2)
    raw, rng = raw_env.raw, np.random.default_rng(0)
    raw.reset()
    times = {name: [] for name in (*SAMPLERS, "raw")}
    try:
        for name, sampler in built.items():   # warm-up: buffers, first compile, worker start
            sampler.collect(state)
        raw_collect(raw, B, spec.num_actions, 16, rng)
        for _ in range(args.rounds):
            for name, sampler in built.items():
                t0 = time.perf_counter()
                sampler.collect(state)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
            times["raw"].append(raw_collect(raw, B, spec.num_actions, T, rng))
        rollout = built["serial"].collect(state).clone()
    finally:
        for sampler in built.values():
            sampler.close()
        raw_env.close()
    if cheap:
        return {"times": {k: statistics.median(v) for k, v in times.items()}, "update_s": None,
                "workers": workers, "steps": T * B}
    update = agent.update
    state, _ = update(state, rollout)   # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    state, _ = update(state, rollout)
    if device.type == "cuda":
        torch.cuda.synchronize()
    update_s = time.perf_counter() - t0
    return {"times": {k: statistics.median(v) for k, v in times.items()}, "update_s": update_s, "workers": workers,
            "steps": T * B}


def table(title: str, config: ppo.Config, m: dict) -> list[str]:
    steps, ceiling = m["steps"], m["steps"] / m["times"]["raw"]
    lines = [f"### {title}", "",
             f"{config.num_envs} envs x {config.num_steps} steps per collect; parallel: {m['workers']} workers; "
             + (f"one PPO update ({config.update_epochs} epochs x {config.num_minibatches} minibatches): "
                f"{m['update_s']:.2f} s" if m["update_s"] is not None else "no update (near-free policy)"), "",
             "| sampler | collect env steps/s | / raw EnvPool | PPO env steps/s (collect + update) |",
             "|---|---:|---:|---:|"]
    for name in SAMPLERS:
        sps = steps / m["times"][name]
        ppo_sps = "" if m["update_s"] is None else f"{steps / (m['times'][name] + m['update_s']):,.0f}"
        lines.append(f"| {name} | {sps:,.0f} | {sps / ceiling:.2f} | {ppo_sps} |")
    lines.append(f"| raw EnvPool (random actions, no policy) | {ceiling:,.0f} | 1.00 | |")
    best = min(SAMPLERS, key=lambda n: m["times"][n])
    lines += ["", f"Best sampler: {best}, {steps / m['times'][best] / ceiling:.0%} of the raw EnvPool ceiling.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--workers", type=int, default=None, help="parallel workers (default: one per core)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the main process")
    parser.add_argument("--compile-act", action="store_true", help="torch.compile the policy in this process")
    parser.add_argument("--skip-pong", action="store_true")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t_start = time.perf_counter()
    lines = ["# Sampler throughput: serial, alternating, parallel vs the raw EnvPool ceiling", "",
             f"Machine: {machine()}.", f"Device: {args.device}; policy acting "
             f"{'compiled' if args.compile_act else 'eager'} in the main process. Load average before: {load()}.",
             "", "Rollout only (median of the interleaved rounds), plus one PPO update timed once; see "
             "`benchmarks/probes/samplers_pong.py` for the method.", ""]
    cases = [("CartPole-v1, PPO 64-64 MLP, 64 envs", CARTPOLE, False)]
    if not args.skip_pong:
        cases[:0] = [("Pong-v5, PPO Nature CNN (CleanRL ppo_atari_envpool settings)", PONG, False),
                     ("Pong-v5, near-free policy (inference cheaper than the env step: the target)",
                      PONG, True)]
    for title, config, cheap in cases:
        lines += table(title, config, measure(config, args, cheap))
        print("\n".join(lines[-12:]), flush=True)
    lines += [f"Load average after: {load()}; whole run {time.perf_counter() - t_start:.0f} s.", ""]
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
