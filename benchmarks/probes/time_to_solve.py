"""Time from the command to a solved CartPole: `fnrl train ppo` tiered (the default), with
`--compile` and with `--no-compile`, cold (empty compile caches) and warm, beside purejaxrl and
stable-baselines3 run the way a new user runs them.

fnrl: `python -m fnrl train ppo --seed S --stop-return 475` (the CartPole preset; the run stops
at the first log row whose trailing mean over the last 100 episodes is at least 475, then
evaluates 10 episodes and plots, as a default run does). Cold: `FNRL_CACHE_DIR`,
`TORCHINDUCTOR_CACHE_DIR` and `TMPDIR` fresh and empty (Inductor keeps its precompiled headers in
the temp dir, whatever `TORCHINDUCTOR_CACHE_DIR` says); warm: caches that an earlier run of the
same mode filled (for the tiered mode, a run whose builder finished and listed its models). A
tiered run that ends before its builder leaves the builder to finish; the next contender starts
only once no builder runs (its extra seconds are reported).

purejaxrl (`--purejaxrl DIR --jax-python PY`): its `purejaxrl/ppo.py` with CleanRL's settings (4
envs x 128, 4 epochs x 4 minibatches, 500k steps, the whole training one jitted call), patched
for gymnax 1.0 (terminated | truncated; brax and navix imports optional) in a temporary copy;
the whole process, jit included, and the mean return of the episodes finished in its last 50
iterations (25,600 steps). stable-baselines3 (`--sb3-python PY`): PPO with the same settings until the mean of
its last 100 episodes reaches 475 (500k steps at most).

Each contender runs in its own process, rounds in turns (the seed is the round's number).

    python benchmarks/probes/time_to_solve.py [--rounds 3] [--modes tiered,compile,no-compile]
        [--purejaxrl DIR --jax-python PY] [--sb3-python PY]
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
MODES = {"tiered (default)": [], "--compile": ["--compile"], "--no-compile": ["--no-compile"]}

PUREJAXRL_SETUP = r'''
import re, shutil, sys, tempfile, time
from pathlib import Path
t0 = time.perf_counter()
src, dst = Path(sys.argv[1]) / "purejaxrl", Path(tempfile.mkdtemp()) / "purejaxrl"
shutil.copytree(src, dst)
w = (dst / "wrappers.py").read_text()
w = w.replace("from brax import envs\n", "try:\n    from brax import envs\nexcept ImportError:\n    envs = None\n")
w = w.replace("from brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper\n",
              "try:\n    from brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper\n"
              "except ImportError:\n    EpisodeWrapper = AutoResetWrapper = object\n")
w = w.replace("import navix as nx\n", "try:\n    import navix as nx\nexcept ImportError:\n    nx = None\n")
w = w.replace("""        obs, state, reward, done, info = self._env.step(key, state, action, params)
        obs = jnp.reshape(obs, (-1,))""", """        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        done = jnp.logical_or(terminated, truncated)
        obs = jnp.reshape(obs, (-1,))""")
(dst / "wrappers.py").write_text(w)
sys.path.insert(0, str(dst))
import jax
from ppo import make_train
'''
"""A purejaxrl checkout (`sys.argv[1]`) copied and patched for gymnax 1.0 (terminated | truncated;
brax and navix imports optional), then `jax` and its `make_train` imported; `t0` is the start."""

PUREJAXRL = PUREJAXRL_SETUP + r'''
config = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 5e5, "UPDATE_EPOCHS": 4,
          "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
          "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
          "ANNEAL_LR": True, "DEBUG": False}
out = jax.block_until_ready(jax.jit(make_train(config))(jax.random.PRNGKey(int(sys.argv[2]))))
info = out["metrics"]
last = info["returned_episode_returns"][-50:][info["returned_episode"][-50:]]   # the last 25,600 steps' episodes
print(f"RESULT steps=500000 return={float(last.mean()):.1f} seconds={time.perf_counter() - t0:.2f}")
'''

SB3 = r'''
import sys, time
t0 = time.perf_counter()
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

class Solved(BaseCallback):
    def _on_step(self):
        buffer = self.model.ep_info_buffer
        return not (len(buffer) >= 100 and np.mean([e["r"] for e in buffer]) >= 475)

env = make_vec_env("CartPole-v1", n_envs=4, seed=int(sys.argv[1]))
model = PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, learning_rate=2.5e-4, gae_lambda=0.95,
            ent_coef=0.01, clip_range=0.2, seed=int(sys.argv[1]), device="cpu",
            policy_kwargs={"net_arch": [64, 64], "activation_fn": __import__("torch").nn.Tanh})
model.learn(500_000, callback=Solved())
buffer = model.ep_info_buffer
print(f"RESULT steps={model.num_timesteps} return={np.mean([e['r'] for e in buffer]):.1f} "
      f"seconds={time.perf_counter() - t0:.2f}")
'''


def wait_for_builders() -> float:
    """Seconds until no tiered builder process runs."""
    t0 = time.perf_counter()
    while subprocess.run(["pgrep", "-f", "fnrl.accel.tiered"], capture_output=True).returncode == 0:
        time.sleep(0.2)
    return time.perf_counter() - t0


def run_fnrl(flags: list[str], seed: int, caches: Path, train_args: tuple = ("ppo", "--stop-return", "475")) -> dict:
    """One `fnrl train *train_args --seed seed *flags` process with its compile caches in `caches`: its
    seconds, the last progress row's env steps, trailing return and final evaluation, and tiering."""
    run = Path(tempfile.mkdtemp()) / "run"
    (caches / "tmp").mkdir(parents=True, exist_ok=True)   # Inductor's precompiled headers live under the temp dir
    env = {**os.environ, "FNRL_CACHE_DIR": str(caches / "fnrl"), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
           "TMPDIR": str(caches / "tmp")}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fnrl", "train", *train_args, "--seed", str(seed),
                    "--log-dir", str(run), *flags], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    builder = wait_for_builders()
    rows = list(csv.DictReader(open(run / "progress.csv")))
    switched = next((int(r["env_steps"]) for r in rows if r["tier"] == "compiled"), None)
    shutil.rmtree(run.parent, ignore_errors=True)
    return {"seconds": seconds, "steps": int(rows[-1]["env_steps"]), "return": float(rows[-1]["return_mean"]),
            "eval": float(rows[-1]["eval_return_mean"]), "first_row_s": float(rows[0]["wall_s"]),
            "loop": float(rows[-1]["wall_s"]), "builder": builder, "switched": switched,
            "solved": float(rows[-1]["return_mean"]) >= 475}


def run_peer(python: str, script: str, args: list[str]) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    t0 = time.perf_counter()
    out = subprocess.run([python, f.name, *args], capture_output=True, text=True, check=True).stdout
    seconds = time.perf_counter() - t0
    os.unlink(f.name)
    fields = dict(kv.split("=") for kv in out.split("RESULT", 1)[1].split())
    return {"seconds": seconds, "steps": int(float(fields["steps"])), "return": float(fields["return"]),
            "solved": float(fields["return"]) >= 475}


def fmt(results: list[dict]) -> str:
    seconds = [r["seconds"] for r in results]
    return f"{statistics.median(seconds):.1f} ({', '.join(f'{s:.1f}' for s in seconds)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--purejaxrl", default=None, help="a purejaxrl checkout")
    parser.add_argument("--jax-python", default=None, help="a Python with jax, flax, optax, distrax, gymnax")
    parser.add_argument("--sb3-python", default=None, help="a Python with stable-baselines3")
    parser.add_argument("--modes", default="tiered,compile,no-compile", help="fnrl's modes to run, of " +
                        ", ".join(name.split()[0].lstrip("-") for name in MODES))
    args = parser.parse_args()
    chosen = args.modes.split(",")
    modes = {name: flags for name, flags in MODES.items() if name.split()[0].lstrip("-") in chosen}
    if len(modes) != len(chosen):
        parser.error(f"--modes takes names of {', '.join(name.split()[0].lstrip('-') for name in MODES)}")
    import torch

    header = (f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, Python "
              f"{sys.version.split()[0]}; {time.strftime('%Y-%m-%d')}.")
    results: dict[tuple[str, str], list[dict]] = {}
    warm = Path(tempfile.mkdtemp(prefix="fnrl-warm-"))
    for name, flags in modes.items():   # fill the warm caches (the tiered run's builder lists its models)
        run_fnrl(flags, 100, warm)
    for r in range(args.rounds):
        for name, flags in modes.items():
            cold = Path(tempfile.mkdtemp(prefix="fnrl-cold-"))
            results.setdefault((name, "cold"), []).append(run_fnrl(flags, r, cold))
            shutil.rmtree(cold, ignore_errors=True)
            results.setdefault((name, "warm"), []).append(run_fnrl(flags, r, warm))
        if args.purejaxrl and args.jax_python:
            results.setdefault(("purejaxrl", "cold = warm"), []).append(
                run_peer(args.jax_python, PUREJAXRL, [args.purejaxrl, str(r)]))
        if args.sb3_python:
            results.setdefault(("stable-baselines3", "-"), []).append(run_peer(args.sb3_python, SB3, [str(r)]))
        print(f"round {r + 1} done", flush=True)
    shutil.rmtree(warm, ignore_errors=True)
    lines = ["# Time from the command to a solved CartPole-v1", "", header, "",
             f"Generated by `python benchmarks/probes/time_to_solve.py --rounds {args.rounds} --modes {args.modes}`; "
             "contenders in turns, "
             "each in its own process, round r with seed r. Seconds are the whole process (import, env, training "
             "to a trailing 100-episode mean of 475, fnrl's final evaluation and plot).", "",
             "| contender | caches | seconds: median (rounds) | env steps at the stop | solved | switch at env steps "
             "(tiered) | builder ran on after the run, s |", "|---|---|---|---|---|---|---|"]
    for (name, caches), rs in results.items():
        steps = ", ".join(str(r["steps"]) for r in rs)
        solved = f"{sum(r['solved'] for r in rs)} of {len(rs)}"
        switched = ", ".join(str(r.get("switched")) for r in rs) if name.startswith("tiered") else ""
        builder = ", ".join(f"{r['builder']:.0f}" for r in rs) if name.startswith("tiered") else ""
        lines.append(f"| {name} | {caches} | {fmt(rs)} | {steps} | {solved} | {switched} | {builder} |")
    OUTPUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
