"""A2C on LunarLander at rl-zoo3's settings: fnrl's 8 seeds against stable-baselines3's 8 seeds.

rl-zoo3's benchmark lists A2C LunarLander at 155.8 +- 80.4: one trained agent, the std over its
evaluation episodes. This runs what that figure stands for on 8 seeds each, in one sitting:

- fnrl: `fnrl train a2c --env LunarLander-v2 --num-seeds 8 --seed 0` (the preset: rl-zoo3's
  hyperparams/a2c.yml on stable-baselines3's A2C defaults), EnvPool's LunarLander-v2;
- stable-baselines3: `A2C("MlpPolicy", ...)` with the same yml entry (8 envs, 5 steps, gamma
  0.995, learning rate linear from 8.3e-4, entropy 1e-5), gymnasium's LunarLander-v3 (Box2D),
  seeds 0-7, two runs at a time, one torch thread each.

Both judged as the learning matrix judges: the mean return of 10 episodes without exploration
(greedy / deterministic) after 200k env steps, per seed; IQM over the 8 seeds. Writes the table
on top of the earlier runs in a2c_lunarlander_sb3.md.

    python benchmarks/probes/a2c_lunarlander_sb3.py --sb3-python PYTHON_WITH_SB3_AND_BOX2D   (~10 min)
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUT = Path(__file__).with_suffix(".md")
SEEDS = range(8)
STEPS = 200_000
GOAL = 155.8 - 80.4   # the learning matrix's goal for this cell: rl-zoo3's mean minus its std

sys.path.insert(0, str(HERE.parent))   # benchmarks/: machine
from machine import cpu_model, prepend_report  # noqa: E402


def sb3_worker(seed: int) -> None:
    """One stable-baselines3 run (in the --sb3-python process): prints its evaluation as JSON."""
    import torch
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    model = A2C("MlpPolicy", make_vec_env("LunarLander-v3", n_envs=8, seed=seed), gamma=0.995, n_steps=5,
                learning_rate=lambda remaining: remaining * 8.3e-4, ent_coef=1e-5, seed=seed, device="cpu")
    model.learn(STEPS)
    mean, _ = evaluate_policy(model, make_vec_env("LunarLander-v3", n_envs=1, seed=10_000 + seed),
                              n_eval_episodes=10, deterministic=True)
    print(json.dumps({"seed": seed, "eval": float(mean)}))


def sb3(python: str) -> list[float]:
    def one(seed):
        out = subprocess.run([python, __file__, "--sb3-worker", str(seed)], capture_output=True, text=True,
                             timeout=3600)
        if out.returncode != 0:
            raise SystemExit(f"stable-baselines3 seed {seed} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["eval"]

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, SEEDS))


def fnrl_seeds() -> list[float]:
    from fnrl.presets import configure
    from fnrl.train import train

    config, preset = configure("a2c", "LunarLander-v2")
    with tempfile.TemporaryDirectory() as tmp:
        result = train("a2c", config, seed=SEEDS[0], num_seeds=len(SEEDS), preset=preset, log_dir=Path(tmp) / "run",
                       quiet=True, tensorboard=False, plot=False)
    return [sum(r) / len(r) for r in result.eval_returns]   # one list of episode returns per seed


def iqm(xs: list[float]) -> float:
    s = sorted(xs)
    k = len(s) // 4
    middle = s[k:len(s) - k]
    return sum(middle) / len(middle)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sb3-python", help="a Python with stable-baselines3, gymnasium[box2d] and the same torch")
    p.add_argument("--sb3-worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sb3_worker is not None:
        sb3_worker(args.sb3_worker)
        return 0
    if not args.sb3_python:
        p.error("--sb3-python is required")
    results = {"fnrl": fnrl_seeds(), "stable-baselines3": sb3(args.sb3_python)}
    version = subprocess.run([args.sb3_python, "-c", "import stable_baselines3 as s; print(s.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    lines = ["# A2C LunarLander at rl-zoo3's settings: fnrl vs stable-baselines3, 8 seeds each", "",
             f"Machine: {cpu_model()}, 2 cores; stable-baselines3 {version}. {STEPS:,} env steps per seed; "
             "final evaluation: 10 episodes without exploration. rl-zoo3's published figure: 155.8 (one run; "
             f"80.4 is the std over its episodes); the learning matrix's goal: IQM >= {GOAL:.1f}.", "",
             "| library | env | IQM | mean | seeds >= goal | per seed (0-7) |", "|---|---|---:|---:|---:|---|"]
    envs = {"fnrl": "EnvPool LunarLander-v2", "stable-baselines3": "gymnasium LunarLander-v3"}
    for name, xs in results.items():
        lines.append(f"| {name} | {envs[name]} | {iqm(xs):.1f} | {sum(xs) / len(xs):.1f} | "
                     f"{sum(x >= GOAL for x in xs)}/{len(xs)} | {', '.join(f'{x:.0f}' for x in xs)} |")
    prepend_report(OUTPUT, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
