"""fnrl's eager tier against stable-baselines3: PPO CartPole-v1 env steps per second, in turns.

The eager tier carries the first seconds of every `fnrl train` run (see fnrl.accel.tiered), and
`--no-compile` runs on it throughout. This runs the benchmark suite's own contenders
(`benchmarks/suite.py --worker eager|sb3 WORKLOAD STEPS THREADS`, each in its own process with
one torch thread) in alternating rounds, on two workloads:

- `ppo-cartpole-4`: CleanRL ppo.py's settings (4 envs x 128 steps, 4 epochs x 4 minibatches);
- `ppo-default-1seed`: fnrl's default CartPole config, rl-zoo3's (8 envs x 32 steps, 20 epochs
  of one minibatch of 256).

SPS is the suite's: env steps over wall time in the second half of each run, updates included.
SB3 runs with `--sb3-python` (a Python with stable-baselines3 and the same torch), fnrl with
this Python. Writes the table on top of the earlier runs in eager_vs_sb3.md.

    python benchmarks/probes/eager_vs_sb3.py --sb3-python PYTHON_WITH_SB3 [--rounds 3] [--steps 40000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE.parent / "suite.py"
OUTPUT = Path(__file__).with_suffix(".md")
WORKLOADS = ("ppo-cartpole-4", "ppo-default-1seed")

sys.path.insert(0, str(HERE.parent))   # benchmarks/: machine
from machine import cpu_model, in_turns, prepend_report  # noqa: E402


def measure(python: str, kind: str, workload: str, steps: int) -> float:
    """Steady env steps/s of one contender, in its own process with one torch thread."""
    out = subprocess.run([python, str(SUITE), "--worker", kind, workload, str(steps), "1"],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{kind} {workload} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["sps"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sb3-python", required=True, help="a Python with stable-baselines3 and the same torch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40_000, help="env steps of every run")
    args = p.parse_args(argv)
    sps = {(w, k): [] for w in WORKLOADS for k in ("eager", "sb3")}
    for r in range(args.rounds):
        for w in WORKLOADS:
            order = ("eager", "sb3") if r % 2 == 0 else ("sb3", "eager")
            for kind in order:
                python = sys.executable if kind == "eager" else args.sb3_python
                sps[w, kind].append(measure(python, kind, w, args.steps))
                print(f"round {r + 1}: {w} {kind} {sps[w, kind][-1]:,.0f} SPS", flush=True)
    version = subprocess.run([args.sb3_python, "-c", "import stable_baselines3 as s; print(s.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    lines = ["# The eager tier against stable-baselines3: PPO CartPole-v1", "",
             f"Machine: {cpu_model()}, one torch thread per contender; stable-baselines3 {version}. "
             f"{args.rounds} rounds of {args.steps:,} env steps per run, the contenders in turns (the first "
             "alternating each round). SPS: env steps per second of wall time in the second half of each run, "
             "updates included; median (range) over rounds. Ratio: the medians' ratio, and its range over "
             "rounds (each round's eager over the same round's SB3).", "",
             "| workload | fnrl eager (`--no-compile`) | stable-baselines3 | eager / SB3 |",
             "|---|---:|---:|---:|"]
    for w in WORKLOADS:
        lines.append(f"| `{w}` | {in_turns(sps[w, 'eager'], sps[w, 'sb3'])} |")
    lines += ["", f"Reproduce: `python benchmarks/probes/eager_vs_sb3.py --sb3-python PYTHON_WITH_SB3 "
                  f"--rounds {args.rounds} --steps {args.steps}`."]
    prepend_report(OUTPUT, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
