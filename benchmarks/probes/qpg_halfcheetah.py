"""SAC and TD3 throughput on HalfCheetah-v4: fnrl (compiled, eager) vs stable-baselines3.

Same settings for all: 256-256 MLPs, batch 256, one gradient update per env step, one env,
one torch thread outside the update. Two numbers per implementation, algorithm and update
thread count (1, and every core: what `fnrl train` picks for these updates, see
`fnrl.run.threads.update_threads_for`; SB3 runs its whole loop at that count, torch's default
being every core):

- updates/s: gradient updates per second on a replay already holding 2,000 random steps
  (fnrl: replay.sample + update, as the training loop does; SB3: `model.train(...)`);
- env steps/s: steps per second of the training loop past learning_starts (acting, env
  step, replay add and one update per step), after compilation.

    python benchmarks/probes/qpg_halfcheetah.py [--sb3-python PATH] [--steps 3000]
    python benchmarks/probes/qpg_halfcheetah.py --interleaved 6 [--algos sac] [--steps 3000]

--interleaved N: the training loops only (env steps/s), fnrl's and SB3's (at SB3's faster thread
count on this machine, every core) each in a fresh process, N rounds taken in turns (fnrl first in
even rounds, SB3 first in odd ones), so the host's drift over minutes falls on both: the rounds,
the ratio of the mean rates and the median of the rounds' ratios. Written as its own section.

SB3 runs in a subprocess with `--sb3-python` (a Python with `stable-baselines3` and
`gymnasium[mujoco]` installed; default: this one). Writes its run on top of the earlier ones in benchmarks/probes/qpg_halfcheetah.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "HalfCheetah-v4"
LEARNING_STARTS = 2_000


def machine() -> str:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
    from machine import cpu_model

    cpu = cpu_model()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} cores, load average {load:.1f} at start; torch {torch.__version__}, "
            f"Python {platform.python_version()}")


# ---------------------------------------------------------------------------
# fnrl
# ---------------------------------------------------------------------------


def fnrl_config(algo: str, steps: int):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from experiments.mujoco import config

    return config(algo, ENV, learning_starts=LEARNING_STARTS, total_steps=LEARNING_STARTS + steps)


def fnrl_updates_per_second(algo: str, compiled: bool, n: int, threads: int = 1) -> float:
    import torch

    from fnrl import envs, replay
    from fnrl.algos import qpg
    from fnrl.samplers import SerialSampler
    from fnrl.run.threads import intra_op_threads

    cfg = fnrl_config(algo, 0)
    env = envs.make(ENV, 1, seed=0)
    agent = qpg.make(cfg, env.spec)
    state = agent.init(0)
    sampler = SerialSampler(env, agent.act, 1000)
    buffer = None
    for _ in range(LEARNING_STARTS // 1000):
        rollout = sampler.collect(state)
        buffer = buffer or replay.init(rollout, cfg.buffer_size, gamma=cfg.gamma)
        buffer = replay.add(buffer, rollout)
    env.close()
    update = torch.compile(agent.update, fullgraph=True) if compiled else agent.update

    def step(state):
        batch = replay.sample(buffer, cfg.batch_size, compiled=compiled)
        with intra_op_threads(threads):   # as the training loop calls it
            return update(state, batch)

    for _ in range(3):  # compile / warm up
        state, _ = step(state)
    start = time.perf_counter()
    for _ in range(n):
        state, metrics = step(state)
    float(metrics["loss/critic"])
    return n / (time.perf_counter() - start)


def fnrl_env_steps_per_second(algo: str, steps: int, update_threads: int | None = None) -> float:
    from fnrl.train import train

    cfg = fnrl_config(algo, steps)
    result = train(algo, cfg, seed=0, compile=True, quiet=True, log_dir=tempfile.mkdtemp() + "/run",
                   log_interval=500, tensorboard=False, plot=False, update_threads=update_threads,
                   checkpoint_every=steps)   # one checkpoint (with the replay), at the end: SB3 writes none
    rows = [r for r in result.history if r["env_steps"] > LEARNING_STARTS + 1000]  # past compilation
    return sum(500 for _ in rows) / sum(500 / r["sps"] for r in rows)


# ---------------------------------------------------------------------------
# stable-baselines3 (run in a subprocess: `--sb3-worker ALGO STEPS UPDATES`)
# ---------------------------------------------------------------------------


def sb3_worker(algo: str, steps: int, updates: int, threads: int = 1) -> dict:
    import importlib.util
    import types

    if importlib.util.find_spec("imageio") is None:
        # gymnasium's MuJoCo package imports imageio for rendering only; it is not installed here
        sys.modules["imageio"] = types.ModuleType("imageio")
    import numpy as np
    import torch
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(threads)
    common = dict(buffer_size=1_000_000, batch_size=256, learning_starts=LEARNING_STARTS, train_freq=1,
                  gradient_steps=1, gamma=0.99, tau=0.005, policy_kwargs=dict(net_arch=[256, 256]),
                  device="cpu", seed=0, verbose=0)
    if algo == "sac":
        model = SAC("MlpPolicy", ENV, learning_rate=3e-4, ent_coef="auto", **common)
    else:
        model = TD3("MlpPolicy", ENV, learning_rate=3e-4, policy_delay=2, target_policy_noise=0.2,
                    target_noise_clip=0.5, action_noise=NormalActionNoise(np.zeros(6), 0.1 * np.ones(6)), **common)
    model.learn(total_timesteps=LEARNING_STARTS + 200)  # random warm-up + first updates
    start = time.perf_counter()
    model.train(gradient_steps=updates, batch_size=256)
    ups = updates / (time.perf_counter() - start)
    start = time.perf_counter()
    model.learn(total_timesteps=steps, reset_num_timesteps=False)
    sps = steps / (time.perf_counter() - start)
    import stable_baselines3

    return {"updates_per_s": ups, "env_steps_per_s": sps, "version": stable_baselines3.__version__}


TITLE = "# SAC and TD3 throughput on HalfCheetah-v4"


def write_under_title(out: Path, section: str) -> None:
    """`section` under the report's title, the earlier runs kept below it."""
    earlier = out.read_text().split("\n", 1)[1].lstrip("\n") if out.exists() else ""
    out.write_text(f"{TITLE}\n\n{section}\n{earlier}")


def fnrl_worker(algo: str, steps: int) -> dict:
    import torch

    torch.set_num_threads(1)   # as `fnrl train` runs: the update's threads are picked by the loop
    return {"env_steps_per_s": fnrl_env_steps_per_second(algo, steps)}


def fnrl_in_child(algo: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--fnrl-worker", algo, str(steps)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def interleaved(algos: list[str], rounds: int, steps: int, python: str, out: Path) -> None:
    """Rounds of the two training loops in turns, each in its own process (module docstring)."""
    import statistics

    cores = len(os.sched_getaffinity(0))
    where = machine()
    lines = [f"## Interleaved run of {time.strftime('%Y-%m-%d')}", "",
             f"Machine: {where}. Training loops only (env steps/s past learning_starts, {steps} steps, "
             f"compilation excluded): `fnrl train` as it runs (its update on the threads it picks), SB3 on "
             f"{cores} threads (its faster setting here). Each in a fresh process, {rounds} rounds in turns "
             "(fnrl first in even rounds).", "",
             "| algo | round | fnrl env steps/s | SB3 env steps/s | fnrl / SB3 | load |", "|---|---:|---:|---:|---:|---:|"]
    summary = []
    for algo in algos:
        mine, theirs = [], []
        for r in range(rounds):
            order = ("fnrl", "sb3") if r % 2 == 0 else ("sb3", "fnrl")
            got = {}
            for who in order:
                got[who] = (fnrl_in_child(algo, steps) if who == "fnrl"
                            else sb3(algo, python, steps, 20, cores))["env_steps_per_s"]
            mine.append(got["fnrl"])
            theirs.append(got["sb3"])
            row = (f"| {algo} | {r} | {got['fnrl']:.0f} | {got['sb3']:.0f} | {got['fnrl'] / got['sb3']:.2f}x "
                   f"| {os.getloadavg()[0]:.1f} |")
            lines.append(row)
            print(row, flush=True)
        ratios = [a / b for a, b in zip(mine, theirs)]
        summary.append(f"- {algo}: mean {statistics.mean(mine):.0f} vs {statistics.mean(theirs):.0f} env steps/s: "
                       f"**{statistics.mean(mine) / statistics.mean(theirs):.2f}x** (median of the rounds "
                       f"{statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x; target 2x).")
    lines += ["", *summary, "",
              f"Reproduce: `python benchmarks/probes/qpg_halfcheetah.py --interleaved {rounds} --algos {','.join(algos)} "
              f"--steps {steps} --sb3-python PYTHON_WITH_SB3`.", ""]
    write_under_title(out, "\n".join(lines))
    print("\n".join(summary))


def sb3(algo: str, python: str, steps: int, updates: int, threads: int = 1) -> dict:
    out = subprocess.run([python, __file__, "--sb3-worker", algo, str(steps), str(updates), str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sb3-python", default=sys.executable)
    parser.add_argument("--steps", type=int, default=3000, help="training-loop env steps timed past learning_starts")
    parser.add_argument("--updates", type=int, default=300, help="updates timed (compiled, SB3); eager: a tenth")
    parser.add_argument("--sb3-worker", nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--fnrl-worker", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--interleaved", type=int, default=0, metavar="ROUNDS",
                        help="only the training loops, fnrl and SB3 in turns for ROUNDS rounds (module docstring)")
    parser.add_argument("--algos", default="sac,td3", help="with --interleaved: comma-separated, of sac,td3")
    parser.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    args = parser.parse_args(argv)
    if args.fnrl_worker:
        print(json.dumps(fnrl_worker(args.fnrl_worker[0], int(args.fnrl_worker[1]))))
        return
    if args.interleaved:
        algos = args.algos.split(",")
        unknown = sorted(set(algos) - {"sac", "td3"})
        if unknown:
            parser.error(f"--algos takes sac and td3, got {', '.join(unknown)}")
        interleaved(algos, args.interleaved, args.steps, args.sb3_python, Path(args.out))
        return
    if args.sb3_worker:
        algo, steps, updates, threads = args.sb3_worker
        print(json.dumps(sb3_worker(algo, int(steps), int(updates), int(threads))))
        return

    import torch

    torch.set_num_threads(1)
    where = machine()
    cores = len(os.sched_getaffinity(0))
    from fnrl.run.threads import update_threads_for

    rows = []
    for algo in ("sac", "td3"):
        picked = update_threads_for(fnrl_config(algo, 0), True, 1, 1)
        r = {"algo": algo, "load": os.getloadavg()[0], "picked": picked}
        for t in sorted({1, cores}):
            r[f"fnrl_compiled_ups_{t}"] = fnrl_updates_per_second(algo, True, args.updates, t)
            r[f"fnrl_sps_{t}"] = fnrl_env_steps_per_second(algo, args.steps, t)
            s3 = sb3(algo, args.sb3_python, args.steps, args.updates, t)
            r[f"sb3_ups_{t}"], r[f"sb3_sps_{t}"], sb3_version = s3["updates_per_s"], s3["env_steps_per_s"], s3["version"]
        r["fnrl_eager_ups"] = fnrl_updates_per_second(algo, False, max(10, args.updates // 10), picked)
        r["load_end"] = os.getloadavg()[0]
        rows.append(r)
        print(json.dumps(r), flush=True)

    threads = sorted({1, cores})
    lines = [
        TITLE,
        "",
        f"Machine: {where}. stable-baselines3 {sb3_version} (gymnasium MuJoCo env), fnrl with EnvPool. "
        "Settings: 256-256 MLPs, batch 256, one update per env step, one env (CleanRL's MuJoCo settings, "
        "`experiments/mujoco.py`). `threads`: the update's torch threads (fnrl: the rest of the loop on 1, "
        f"as `fnrl train` runs it, which picks {' / '.join(str(r['picked']) for r in rows)} for SAC / TD3 here; "
        "SB3: its whole loop on that many). One run "
        "each, one after the other; the machine is shared, so expect noise of tens of percent.",
        "",
        "| algo | threads | fnrl compiled updates/s | SB3 updates/s | fnrl compiled env steps/s | SB3 env steps/s "
        "| fnrl / SB3 (env steps/s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for t in threads:
            lines.append(f"| {r['algo']} | {t} | {r[f'fnrl_compiled_ups_{t}']:.0f} | {r[f'sb3_ups_{t}']:.0f} "
                         f"| {r[f'fnrl_sps_{t}']:.0f} | {r[f'sb3_sps_{t}']:.0f} "
                         f"| {r[f'fnrl_sps_{t}'] / r[f'sb3_sps_{t}']:.2f}x |")
    lines += [""]
    for r in rows:
        best = max(r[f"sb3_sps_{t}"] for t in threads)
        mine = r[f"fnrl_sps_{r['picked']}"]
        lines.append(f"- {r['algo']}: `fnrl train` ({r['picked']} update thread(s)) {mine:.0f} env steps/s vs SB3's "
                     f"faster setting {best:.0f}: **{mine / best:.2f}x** (target 2x); fnrl eager "
                     f"{r['fnrl_eager_ups']:.0f} updates/s; load {r['load']:.1f} -> {r['load_end']:.1f}.")
    lines += [
        "",
        "updates/s: replay sample + one gradient update (critics, actor, temperature, targets) on a "
        f"replay of {LEARNING_STARTS} random steps. env steps/s: the training loop past learning_starts "
        f"({args.steps} steps, compilation excluded). Peers measured before on this kind of machine: "
        "CleanRL SAC 66-83 env steps/s, SB3 SAC ~78.",
        "",
        "Both are compute-bound on the 256-wide matrix products. fnrl runs the whole update as one "
        "compiled graph (twin critics as one vmapped batched matmul, one Adam over all parameters, "
        "one polyak step). TD3 skips its actor step off the policy_delay cadence as SB3 does, "
        "through a torch.cond in the one graph (no Python branch, no recompile; "
        "`td3_delay.md`).",
        "",
        f"Reproduce: `python benchmarks/probes/qpg_halfcheetah.py --sb3-python PYTHON_WITH_SB3 --steps {args.steps} "
        f"--updates {args.updates}`.",
        "",
    ]
    write_under_title(Path(args.out), "\n".join([f"## Run of {time.strftime('%Y-%m-%d')}", "", *lines[2:]]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
