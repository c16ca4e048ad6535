"""Few-row products elementwise: compiled acting with `fnrl.nets.Linear`'s rule on and off.

Under torch.compile, `fnrl.nets.Linear` computes a product of at most `FEW_ROWS` rows and
`FEW_ROWS_MACS` multiply-adds as a broadcast product summed over its inputs instead of a
GEMM (see its docstring): the acting step of one to a few envs. This script compares two
ahead-of-time acting models of the same agent (`fnrl.accel.aot.AotAct`), one traced with
`FEW_ROWS = 0` (every layer a GEMM: fnrl before this rule) and one with fnrl's default:

- **alone**: each model called in a tight loop on the same state and observation,
  interleaved rounds (median µs per call);
- **in the training loop**: one `fnrl.train` run whose sampler calls the two models in
  alternating blocks of env steps, after both are built (the loop's wall time per env step
  in each side's blocks; the updates, replay writes and logging fall into both sides alike).

Workloads: DQN CartPole with CleanRL's settings (one env, 4-120-84-2 Q-network), PPO CartPole
with CleanRL's settings (4 envs, 64-64 MLPs), SAC's HalfCheetah actor alone (one env, 17-256-256-12).

    python benchmarks/probes/few_rows.py [--only dqn,ppo,sac] [--out FILE]
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

import torch

import fnrl.nets.core as core
import fnrl.train as train_mod
from fnrl import algos, envs
from fnrl.accel import aot, compiled

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite
from machine import cpu_model  # noqa: E402
from suite import CARTPOLE_DQN, CARTPOLE_PPO, HALFCHEETAH_SAC  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")

# (algo, settings, total env steps, act calls before the window, act calls per block)
WORKLOADS = {
    "dqn": ("dqn", CARTPOLE_DQN, 40_000, 12_000, 500, "DQN CartPole, CleanRL settings (1 env, 4-120-84-2)"),
    "ppo": ("ppo", CARTPOLE_PPO, 100_000, 3_000, 384, "PPO CartPole, CleanRL settings (4 envs, 64-64 MLPs)"),
    "sac": ("sac", HALFCHEETAH_SAC, None, None, None, "SAC HalfCheetah actor (1 env, 17-256-256-12)"),
}


def _config(algo: str, settings: dict, total_steps: int | None):
    config = dataclasses.replace(algos.default_config(algo), **settings)
    return config if total_steps is None else dataclasses.replace(config, total_steps=total_steps)


def _twin(act: aot.AotAct) -> aot.AotAct:
    return aot.AotAct(act.act, act.select, act.fallback, act.options)


DEFAULT = core.FEW_ROWS
SIDES = {"GEMM": 0, "elementwise": DEFAULT}


def _call(model: aot.AotAct, few_rows: int, state, obs):
    core.FEW_ROWS = few_rows   # read while a model is traced (its first call), not after
    try:
        return model(state, obs, None, True)
    finally:
        core.FEW_ROWS = DEFAULT


def alone(models: dict, state, obs, calls: int = 2000, rounds: int = 9) -> dict:
    """Median µs per call of each model, interleaved rounds."""
    times = {k: [] for k in models}
    for _ in range(rounds):
        for side, model in models.items():
            t = time.perf_counter()
            for _ in range(calls):
                model(state, obs, None, True)
            times[side].append((time.perf_counter() - t) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def act_models(algo: str, settings: dict) -> tuple[dict, object, torch.Tensor]:
    """Both acting models of `algo`'s agent, built, with a state and an observation batch."""
    module = algos.load(algo)
    config = _config(algo, settings, None)
    env = envs.make(config.env_id, config.num_envs, seed=0)
    try:
        agent = compiled.make_agent(module, config, env.spec, compile=True)
        obs = env.reset()["obs"]
    finally:
        env.close()
    state = agent.init(0)
    models = {side: _twin(agent.act) for side in SIDES}
    for side, model in models.items():
        _call(model, SIDES[side], state, obs)
    return models, state, obs


def in_loop(algo: str, settings: dict, total_steps: int, start: int, block: int) -> dict:
    """Wall µs per env step in each side's blocks of one training run."""
    spent = {side: [0.0, 0] for side in SIDES}
    make_agent = compiled.make_agent

    def make_alternating_agent(module, config, spec, compile, *args, **kwargs):
        agent = make_agent(module, config, spec, compile, *args, **kwargs)
        models = {side: _twin(agent.act) for side in SIDES}
        calls = {"n": 0, "side": "GEMM", "t": None}

        def act(state, obs, carry, explore=True):
            calls["n"] += 1
            n = calls["n"]
            if n == start - 100:   # build both models outside the window
                for side, model in models.items():
                    _call(model, SIDES[side], state, obs)
            if n > start and n % block == 0:
                now = time.perf_counter()
                if calls["t"] is not None:
                    spent[calls["side"]][0] += now - calls["t"]
                    spent[calls["side"]][1] += block * config.num_envs
                calls["t"], calls["side"] = now, ("elementwise" if (n // block) % 2 else "GEMM")
            if carry is not None or not explore or n < start - 100:
                return agent.act(state, obs, carry, explore)
            return models[calls["side"]](state, obs, carry, explore)

        return agent._replace(act=act)

    compiled.make_agent = make_alternating_agent
    try:
        with tempfile.TemporaryDirectory() as tmp:
            train_mod.train(algo, _config(algo, settings, total_steps), seed=1, log_dir=Path(tmp) / "run",
                            quiet=True, tensorboard=False, plot=False, threads=1)
    finally:
        compiled.make_agent = make_agent
    return {side: 1e6 * t / n for side, (t, n) in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="dqn,ppo,sac")
    p.add_argument("--out", type=Path, default=OUTPUT)
    args = p.parse_args()
    torch.set_num_threads(1)
    load0, t0 = os.getloadavg(), time.perf_counter()
    rows = ["| workload | GEMM µs per act call (alone) | elementwise | speed-up | GEMM µs per env step (training loop) "
            "| elementwise | speed-up |", "|---|---:|---:|---:|---:|---:|---:|"]
    for key in args.only.split(","):
        algo, settings, total, start, block, label = WORKLOADS[key]
        models, state, obs = act_models(algo, settings)
        a = alone(models, state, obs)
        line = f"| {label} | {a['GEMM']:.1f} | {a['elementwise']:.1f} | {a['GEMM'] / a['elementwise']:.2f}x"
        if total is not None:
            loop = in_loop(algo, settings, total, start, block)
            line += f" | {loop['GEMM']:.1f} | {loop['elementwise']:.1f} | {loop['GEMM'] / loop['elementwise']:.3f}x |"
        else:
            line += " | – | – | – |"
        rows.append(line)
        print(line, flush=True)
    load1 = os.getloadavg()
    text = "\n".join([
        "# Few-row products elementwise in compiled acting",
        "",
        f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none used, torch {torch.__version__} "
        f"(1 intra-op thread), Python {platform.python_version()}. Load average {load0[0]:.2f} -> {load1[0]:.2f}; "
        f"whole run {time.perf_counter() - t0:.0f} s.",
        "",
        "`GEMM`: the acting model traced with `fnrl.nets.core.FEW_ROWS = 0` (every layer `F.linear`); "
        f"`elementwise`: fnrl's default (`FEW_ROWS = {DEFAULT}`, `FEW_ROWS_MACS = {core.FEW_ROWS_MACS:,}`). "
        "Alone: median of 9 interleaved rounds of 2,000 calls. Training loop: one `fnrl.train` run that acts "
        "through the two models in alternating blocks of env steps. Generated by `python benchmarks/probes/few_rows.py`.",
        "",
        *rows,
        "",
    ])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
