"""Where a PPO iteration's time goes, and which acting / sampling path is fastest.

PPO CartPole-v1 with purejaxrl's settings (64 envs x 128 steps, 4 epochs x 4 minibatches
of 2048) and CleanRL's (4 envs x 128 steps, minibatches of 128), 64-64 tanh MLPs. One
iteration = collect a [128, B] rollout + one update, as `fnrl.train` runs it. Variants,
each in its own process, one after the other:

- `serial, compiled act`: as `fnrl train` runs it: the serial sampler, `act` compiled ahead
  of time (`fnrl.accel.aot.AotAct`) on `ppo.ACT_KEYS` of the state, the compiled update (`prepare`
  + all minibatch steps in one `scan`; on 1 thread here, see `threads.py` for 2),
  TorchDynamo's guard checks skipped once warm (`fnrl.accel.compiled.steady`);
- `serial, eager act`: the same with `act` eager (`fnrl.nets.call` swaps the parameters
  straight into the modules);
- `alternating, eager act`: two EnvPool groups of B/2 whose steps overlap the policy;
- `eager act, eager update`: `fnrl train --no-compile`.

Columns (ms per iteration): `act` (policy forward + sampling), `raw env` (EnvPool's own
step; for the alternating sampler, the time spent waiting in `recv`), `sampler + adaptor`
(the rest of the collect: actions to numpy, flags and episode statistics, the writes into
the rollout buffer), `update`, `rest` (the loop around them), and the SPS that results.
`raw` is 128 random-action steps of the same envs (the ceiling): EnvPool at 64 envs, the
in-process gymnasium batch that `fnrl.envs.make` picks for up to 4 classic-control envs.

    python benchmarks/probes/ppo_breakdown.py [--iterations 10] [--threads 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from fnrl import envs, samplers
from fnrl.algos import ppo
from fnrl.accel.aot import AotAct
from fnrl.accel.compiled import acting_on, steady

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
SETTINGS = dict(env_id="CartPole-v1", num_steps=128, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99,
                gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.2, anneal_clip=False,
                clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, hidden=(64, 64),
                total_steps=10_000_000)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


class Timed:
    """Accumulates the wall time of wrapped callables by name."""

    def __init__(self):
        self.total = defaultdict(float)

    def wrap(self, fn, name):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self.total[name] += time.perf_counter() - t
            return out
        return timed


class TimedRaw:
    """Stands in for the backend's env, timing its step (EnvPool's C++ `step`, or `send` + `recv`;
    the in-process gymnasium batch's `step`)."""

    def __init__(self, raw, timed: Timed):
        self._raw = raw
        for name in ("step", "send", "recv", "_send", "_recv"):   # _send/_recv: fnrl.envs.batched.EnvPoolCalls
            if hasattr(raw, name):
                setattr(self, name, timed.wrap(getattr(raw, name), "raw_env"))

    def __getattr__(self, name):
        return getattr(self._raw, name)


class Variant:
    """One way of running PPO iterations: a sampler kind, act compiled or not."""

    def __init__(self, name, num_envs, sampler, compile_act, update):
        self.name = name
        config = ppo.Config(**SETTINGS, num_envs=num_envs)
        env = envs.make(config.env_id, num_envs, seed=0)
        agent = ppo.make(config, env.spec, compile=False)
        self.state = agent.init(0)
        self.timed = Timed()
        act = agent.act
        if compile_act:   # as fnrl.accel.compiled.make_agent compiles it
            fallback = acting_on(ppo.ACT_KEYS, torch.compile(agent.act, fullgraph=True, dynamic=False,
                                                             options={"cpp_wrapper": True}))
            act = AotAct(agent.act, ppo.ACT_KEYS, fallback)
        self.sampler = samplers.make(sampler, env, self.timed.wrap(act, "act"), config.num_steps)
        for e in getattr(self.sampler, "envs", [env]):
            e.raw = TimedRaw(e.raw, self.timed)
        self.update = self.timed.wrap(update, "update")
        self.collect = self.timed.wrap(self.sampler.collect, "collect")
        self.steps = num_envs * config.num_steps
        self.seconds, self.iterations = 0.0, 0
        self.iteration()   # allocation, compile
        self.iteration()   # warm: guard checks skipped from here on
        self.timed.total.clear()
        self.seconds, self.iterations = 0.0, 1

    def iteration(self):
        warm = self.iterations > 0
        t = time.perf_counter()
        with steady(warm):
            rollout = self.collect(self.state)
            self.state["env_steps"] += self.steps
            self.state, _ = self.update(self.state, rollout)
        self.seconds += time.perf_counter() - t
        self.iterations += 1

    def row(self) -> dict:
        n = self.iterations - 1
        per = {k: v / n * 1e3 for k, v in self.timed.total.items()}
        total = self.seconds / n * 1e3
        return {"act": per["act"], "raw env": per["raw_env"],
                "sampler + adaptor": per["collect"] - per["act"] - per["raw_env"], "update": per["update"],
                "rest": total - per["collect"] - per["update"], "total": total, "sps": self.steps / total * 1e3}


def raw_rollout_ms(num_envs: int, rounds: int) -> float:
    env = envs.make("CartPole-v1", num_envs, seed=0)
    rng = np.random.default_rng(0)
    env.raw.reset()
    times = []
    for _ in range(rounds * 3):
        actions = [rng.integers(0, 2, size=num_envs, dtype=np.int32) for _ in range(128)]
        t = time.perf_counter()
        for a in actions:
            env.raw.step(a)
        times.append(time.perf_counter() - t)
    env.close()
    return statistics.median(times) * 1e3


VARIANTS = {"serial, compiled act": ("serial", True, True),
            "serial, eager act": ("serial", False, True),
            "alternating, compiled act": ("alternating", True, True),
            "alternating, eager act": ("alternating", False, True),
            "eager act, eager update": ("serial", False, False)}


def measure_variant(name: str, num_envs: int, iterations: int) -> dict:
    """One variant in this (fresh) process: `iterations` warm iterations after two warm-up ones."""
    sampler, compile_act, compile_update = VARIANTS[name]
    config = ppo.Config(**SETTINGS, num_envs=num_envs)
    update = ppo.make(config, envs.env_spec(config.env_id, num_envs), compile=compile_update).update
    v = Variant(name, num_envs, sampler, compile_act, update)
    for _ in range(iterations):
        v.iteration()
    return v.row()


def measure(num_envs: int, iterations: int) -> tuple[dict, float]:
    """Each variant in its own process, one after the other (as `fnrl bench` runs contenders)."""
    rows = {}
    for name in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--variant", name, "--num-envs", str(num_envs),
                              "--iterations", str(iterations)], capture_output=True, text=True, check=True)
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows, raw_rollout_ms(num_envs, 3)


def table(num_envs: int, rows: dict, raw_ms: float) -> list[str]:
    cols = ["act", "raw env", "sampler + adaptor", "update", "rest", "total"]
    kind = "in-process gymnasium" if envs.steps_in_process("CartPole-v1", num_envs, {}) else "EnvPool"
    out = [f"### {num_envs} envs x 128 steps (raw {kind}, 128 random-action steps: {raw_ms:.1f} ms, "
           f"{num_envs * 128 / raw_ms * 1e3:,.0f} SPS)", "",
           "| variant | " + " | ".join(cols) + " | SPS | collect / raw |", "|---" * (len(cols) + 3) + "|"]
    for name, r in rows.items():
        collect = r["act"] + r["raw env"] + r["sampler + adaptor"]
        cells = [f"{r[c]:.1f} ({r[c] / r['total']:.0%})" if c != "total" else f"{r[c]:.1f}" for c in cols]
        out.append(f"| {name} | " + " | ".join(cells) + f" | {r['sps']:,.0f} | {collect / raw_ms:.2f}x |")
    return out + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=10, help="measured iterations at 64 envs (x8 at 4)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.variant:   # a child process: one variant, its row as JSON on the last line
        print(json.dumps(measure_variant(args.variant, args.num_envs, args.iterations)))
        return
    t0, start_load = time.perf_counter(), load()
    lines = ["# PPO CartPole: where an iteration's time goes", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none (CPU only), torch {torch.__version__} "
             f"({torch.get_num_threads()} intra-op thread(s)), Python {platform.python_version()}.",
             f"Load average at start: {start_load}.", "",
             "Milliseconds per iteration (collect a [128, B] rollout + one update of 4 epochs x 4 minibatches), "
             "means over the measured iterations after two warm-up ones, each variant in its own process; shares of "
             "the iteration in brackets. See the script's docstring for the columns.", ""]
    for num_envs in (64, 4):
        rows, raw_ms = measure(num_envs, args.iterations * (1 if num_envs >= 16 else 8))
        lines += table(num_envs, rows, raw_ms)
    lines.append(f"Load average at end: {load()}; whole run {time.perf_counter() - t0:.0f} s. "
                 f"Generated by `python benchmarks/probes/ppo_breakdown.py`.")
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
