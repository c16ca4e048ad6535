"""Steady PPO CartPole-v1 env steps per second: fnrl's graph sampler against purejaxrl, in turns.

Both on purejaxrl's `ppo.py` settings, CleanRL's (B envs x 128 steps, 4 epochs x 4 minibatches,
lr 2.5e-4 annealed, 64-64 tanh), at B = 4 and 64, for `--steps` env steps (2M by default):

- fnrl: the benchmark suite's compiled contender on `ppo-cartpole-B-graph` (`--sampler graph`:
  the rollout, with the env, one compiled call), in its own process with `--threads` torch
  threads; steady = env steps over wall time in the second half of the run;
- purejaxrl: its `make_train(config)` jitted, called once (jit included), then timed on a second
  call with another key: steady = steps / that call's seconds (its whole training is one call).

Rounds alternate which contender goes first. Writes the table on top of the earlier runs in purejaxrl_steady.md.

    python benchmarks/probes/purejaxrl_steady.py --purejaxrl DIR --jax-python PY [--rounds 3] [--envs 4,64]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent / "suite.py"
OUTPUT = Path(__file__).with_suffix(".md")

sys.path.insert(0, str(HERE.parent))   # benchmarks/: machine
sys.path.insert(0, str(HERE))          # probes/: the purejaxrl patch of time_to_solve
from machine import cpu_model, in_turns, prepend_report  # noqa: E402
from time_to_solve import PUREJAXRL_SETUP  # noqa: E402

PUREJAXRL_STEADY = PUREJAXRL_SETUP + r'''
envs, steps = int(sys.argv[2]), int(sys.argv[3])
config = {"LR": 2.5e-4, "NUM_ENVS": envs, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": steps, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
          "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
train = jax.jit(make_train(config))
jax.block_until_ready(train(jax.random.PRNGKey(0)))
t1 = time.perf_counter()
jax.block_until_ready(train(jax.random.PRNGKey(1)))
print(f"RESULT sps={steps / (time.perf_counter() - t1):.1f}")
'''


def fnrl_sps(envs: int, steps: int, threads: int) -> float:
    out = subprocess.run([sys.executable, str(SUITE), "--worker", "compiled", f"ppo-cartpole-{envs}-graph",
                          str(steps), str(threads)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"fnrl {envs} envs failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["sps"]


def purejaxrl_sps(python: str, checkout: str, envs: int, steps: int) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(PUREJAXRL_STEADY)
        f.flush()
        out = subprocess.run([python, f.name, checkout, str(envs), str(steps)], capture_output=True, text=True,
                             timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"purejaxrl {envs} envs failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(out.stdout.split("RESULT sps=", 1)[1].split()[0])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--purejaxrl", required=True, help="a purejaxrl checkout")
    p.add_argument("--jax-python", required=True, help="a Python with jax, flax, optax, distrax, gymnax")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2_000_000)
    p.add_argument("--envs", default="4,64")
    p.add_argument("--threads", type=int, default=2, help="fnrl's torch threads (XLA uses every core)")
    args = p.parse_args(argv)
    widths = [int(e) for e in args.envs.split(",")]
    sps = {(b, k): [] for b in widths for k in ("fnrl", "purejaxrl")}
    for r in range(args.rounds):
        for b in widths:
            for kind in (("fnrl", "purejaxrl") if r % 2 == 0 else ("purejaxrl", "fnrl")):
                sps[b, kind].append(fnrl_sps(b, args.steps, args.threads) if kind == "fnrl"
                                    else purejaxrl_sps(args.jax_python, args.purejaxrl, b, args.steps))
                print(f"round {r + 1}: {b} envs {kind} {sps[b, kind][-1]:,.0f} SPS", flush=True)
    lines = ["# Steady PPO CartPole-v1: fnrl's graph sampler against purejaxrl", "",
             f"Machine: {cpu_model()}; fnrl with {args.threads} torch threads, purejaxrl's XLA on every core. "
             f"{args.rounds} rounds of {args.steps:,} env steps per run, the contenders in turns (the first "
             "alternating each round); purejaxrl's `ppo.py` settings (B envs x 128 steps, 4 epochs x 4 minibatches). "
             "SPS: fnrl over the second half of its run (`--sampler graph`, compiled), purejaxrl over a second "
             "jitted call of its whole training; median (range) over rounds. Ratio: the medians', and its range "
             "over rounds (each round's fnrl over the same round's purejaxrl).", "",
             "| envs | fnrl `--sampler graph` | purejaxrl | fnrl / purejaxrl |", "|---:|---:|---:|---:|"]
    for b in widths:
        lines.append(f"| {b} | {in_turns(sps[b, 'fnrl'], sps[b, 'purejaxrl'])} |")
    lines += ["", f"Reproduce: `python benchmarks/probes/purejaxrl_steady.py --purejaxrl DIR --jax-python PY "
                  f"--rounds {args.rounds} --steps {args.steps} --envs {args.envs}`."]
    prepend_report(OUTPUT, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
