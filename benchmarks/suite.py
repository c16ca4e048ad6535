"""The benchmark suite behind `fnrl bench`: one table of env steps per second.

For each workload (algorithm x env x settings) it measures, side by side in one run:

- the raw env ceiling: the envs fnrl steps (EnvPool; gymnasium in-process for up to 4
  classic-control envs, see `fnrl.envs.steps_in_process`), random actions, no policy, no torch;
- fnrl compiled (`torch.compile` of acting and update) and fnrl eager, through `fnrl.train`;
- stable-baselines3 on the same settings (its own gymnasium / ALE envs);
- fnrl's cold compile time: the extra wall time of the first log intervals over the
  steady rate (Inductor's on-disk cache is disabled for the compiled run);

and the ratios. SPS is steady-state: env steps over wall time after the first half of the
run (updates included). Every contender runs in its own subprocess with the same torch
thread count, so none inherits another's compiled code, threads or caches.

    fnrl bench [--quick] [--only ppo-cartpole-4,dqn-cartpole] [--threads 1] [--out FILE]
               [--steps N] [--contenders raw,compiled,eager,sb3] [--device cpu|cuda]
    fnrl bench --learning [--only ALGO/ENV,...]   # the learning matrix: benchmarks/learning.py
    python benchmarks/suite.py --quick          # the same, from a source checkout

Peers that are not installed (stable-baselines3, ale-py for Atari, mujoco for MuJoCo) are
reported as missing in their cell; the fnrl and EnvPool columns are measured regardless.
The numbers that CleanRL and purejaxrl reached earlier on this kind of machine are quoted
in the notes, not re-run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "suite.md"
QUICK_OUTPUT = HERE / "suite_quick.md"


@dataclass(frozen=True)
class Workload:
    """One row of the suite: an fnrl config and the same settings for stable-baselines3."""

    key: str
    algo: str
    config: dict
    steps: int
    quick_steps: int | None  # None: left out of --quick
    sb3: str | None  # name of a builder in SB3_MODELS
    note: str = ""
    train_kwargs: dict = field(default_factory=dict)
    contenders: tuple[str, ...] = ("raw", "compiled", "eager", "sb3")

    @property
    def rows(self) -> int:
        """Independent runs trained side by side (fnrl --num-seeds)."""
        return self.train_kwargs.get("num_seeds", 1)


CARTPOLE_PPO = dict(env_id="CartPole-v1", num_envs=4, num_steps=128, learning_rate=2.5e-4, anneal_lr=True,
                    gamma=0.99, gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.2,
                    anneal_clip=False, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                    hidden=(64, 64), activation="tanh")
"""CleanRL ppo.py's CartPole settings (peers on this kind of machine: SB3 4.2k, CleanRL 3.9k, purejaxrl 121k SPS)."""

PONG_PPO = dict(env_id="Pong-v5", num_envs=8, num_steps=128, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99,
                gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.1, anneal_clip=False,
                clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, conv="nature")
"""CleanRL ppo_atari_envpool.py's settings (peers on this kind of machine: SB3 ~276, CleanRL ~306 SPS)."""

CARTPOLE_DQN = dict(env_id="CartPole-v1", num_envs=1, num_steps=10, buffer_size=10_000, batch_size=128,
                    learning_starts=10_000, replay_ratio=0.1, n_step=1, gamma=0.99, optimizer="adam",
                    learning_rate=2.5e-4, optimizer_eps=1e-8, max_grad_norm=0.0, huber_delta=0.0,
                    target_update_interval=50, tau=1.0, eps_init=1.0, eps_final=0.05, eps_steps=50_000,
                    hidden=(120, 84), activation="relu")
"""CleanRL dqn.py's settings: one env, an update every 10 steps (peers on this kind of machine: SB3 2.6k, CleanRL 3.6k SPS)."""

PONG_DQN = dict(env_id="Pong-v5", num_envs=1, num_steps=4, buffer_size=100_000, batch_size=32, learning_starts=5_000,
                replay_ratio=0.25, n_step=1, gamma=0.99, optimizer="adam", learning_rate=1e-4, optimizer_eps=1e-8,
                max_grad_norm=0.0, huber_delta=0.0, target_update_interval=250, tau=1.0, eps_init=1.0,
                eps_final=0.01, eps_steps=5_001, conv="nature")
"""CleanRL dqn_atari.py's settings (1 env, an update of 32 every 4 steps, lr 1e-4, MSE loss, Nature CNN, target
copy every 1000 env steps) with a 100k replay and 5k random steps instead of 1M and 80k, and epsilon at its final
0.01 from the first update, so that the measured half of a short run acts as a long run's does (SB3 skips the
Q-network on exploring steps)."""

HALFCHEETAH_SAC = dict(env_id="HalfCheetah-v4", num_envs=1, num_steps=1, buffer_size=1_000_000, batch_size=256,
                       learning_starts=2_000, replay_ratio=1.0, gamma=0.99, tau=0.005, hidden=(256, 256),
                       actor_lr=3e-4, critic_lr=1e-3, alpha_lr=1e-3, autotune=True)
"""CleanRL's SAC settings with a 2k-step warm-up: batch 256, one update per env step (peers on this kind of machine: SB3 ~79 SPS)."""

WORKLOADS = [
    Workload("ppo-cartpole-4", "ppo", dict(CARTPOLE_PPO, total_steps=100_000), 100_000, 20_480, "ppo_cartpole",
             "CleanRL settings, 4 envs x 128, 4 epochs x 4 minibatches"),
    Workload("ppo-cartpole-64", "ppo", dict(CARTPOLE_PPO, num_envs=64, total_steps=500_000), 500_000, 65_536,
             "ppo_cartpole", "purejaxrl settings, 64 envs x 128, 4 epochs x 4 minibatches"),
    Workload("ppo-cartpole-64-lr", "ppo", dict(CARTPOLE_PPO, num_envs=64, learning_rate=2.5e-3, total_steps=500_000),
             500_000, None, None,
             "the same with a 10x learning rate (2.5e-3, annealed), which solves CartPole within the 500k steps "
             "(the 64-env milestone: 120k SPS while reaching 475); left out of --quick (its return needs the whole "
             "run) and without SB3 (the row above measures SB3 at these shapes)",
             contenders=("raw", "compiled", "eager")),
    Workload("ppo-cartpole-64-alternating", "ppo", dict(CARTPOLE_PPO, num_envs=64, total_steps=500_000), 500_000,
             65_536, None, "`ppo-cartpole-64` with `--sampler alternating` (two EnvPools of 32, one stepping while "
             "the policy acts for the other)", train_kwargs={"sampler": "alternating"}, contenders=("compiled",)),
    # the same three with the graph sampler (fnrl.samplers.graph): CartPole's dynamics in torch, each rollout
    # one compiled call with the policy; the raw EnvPool ceiling does not apply to them
    Workload("ppo-cartpole-4-graph", "ppo", dict(CARTPOLE_PPO, total_steps=100_000), 100_000, 20_480,
             "ppo_cartpole", "`ppo-cartpole-4` with `--sampler graph`", train_kwargs={"sampler": "graph"},
             contenders=("compiled", "sb3")),
    Workload("ppo-cartpole-64-graph", "ppo", dict(CARTPOLE_PPO, num_envs=64, total_steps=500_000), 500_000, 65_536,
             None, "`ppo-cartpole-64` with `--sampler graph` (SB3: the `ppo-cartpole-64` row)",
             train_kwargs={"sampler": "graph"}, contenders=("compiled",)),
    Workload("ppo-cartpole-64-lr-graph", "ppo", dict(CARTPOLE_PPO, num_envs=64, learning_rate=2.5e-3,
                                                     total_steps=500_000), 500_000, 500_000, None,
             "`ppo-cartpole-64-lr` with `--sampler graph`: the 64-env milestone with the rollout compiled whole "
             "(in --quick too: at this speed the whole run takes seconds)", train_kwargs={"sampler": "graph"},
             contenders=("compiled",)),
    Workload("dqn-cartpole", "dqn", dict(CARTPOLE_DQN, total_steps=100_000), 100_000, 20_000, "dqn_cartpole",
             "CleanRL dqn.py settings, 1 env (stepped in-process, as SB3 steps its own), batch 128, an update "
             "every 10 steps"),
    Workload("dqn-pong", "dqn", dict(PONG_DQN, total_steps=15_000), 15_000, None, "dqn_pong",
             "CleanRL dqn_atari.py settings with a 100k replay and 5k random steps, 1 env on EnvPool (SB3: "
             "PongNoFrameskip-v4 with its Atari wrappers and 4 stacked frames), an update of 32 every 4 steps"),
    Workload("sac-halfcheetah", "sac", dict(HALFCHEETAH_SAC, total_steps=8_000), 8_000, None, "sac_halfcheetah",
             "CleanRL settings, batch 256, one update per step after 2k random steps"),
    Workload("ppo-pong", "ppo", dict(PONG_PPO, total_steps=5_120), 5_120, None, "ppo_pong",
             "CleanRL Atari settings, 8 envs x 128, Nature CNN"),
    # 64k steps per seed in both rows: each measured second half lasts several seconds (the 8 seeds'
    # once ran 16k steps, under 2 s measured, and its ratio read 3.8-5.2x in three runs)
    Workload("ppo-default-1seed", "ppo", dict(env_id="CartPole-v1", total_steps=100_000), 100_000, 65_536,
             "ppo_default_cartpole", "fnrl's default PPO CartPole config (rl-zoo3's: 8 envs x 32 steps, 20 epochs of "
             "one minibatch), one seed", contenders=("raw", "compiled", "eager", "sb3")),
    Workload("ppo-default-8seeds", "ppo", dict(env_id="CartPole-v1", total_steps=100_000), 100_000, 65_536, None,
             "the same config, 8 seeds vmapped in one process (`--num-seeds 8`; steps are per seed, SPS counts "
             "all seeds)", train_kwargs={"num_seeds": 8}, contenders=("raw", "compiled")),
    Workload("ppo-default-1seed-graph", "ppo", dict(env_id="CartPole-v1", total_steps=100_000), 100_000, 65_536,
             None, "`ppo-default-1seed` with `--sampler graph`", train_kwargs={"sampler": "graph"},
             contenders=("compiled",)),
    Workload("ppo-default-8seeds-graph", "ppo", dict(env_id="CartPole-v1", total_steps=100_000), 100_000, 65_536,
             None, "`ppo-default-8seeds` with `--sampler graph`", train_kwargs={"num_seeds": 8, "sampler": "graph"},
             contenders=("compiled",)),
]
BY_KEY = {w.key: w for w in WORKLOADS}


# --------------------------------------------------------------------------- contenders (subprocess side)

DEVICE_VAR = "FNRL_BENCH_DEVICE"
"""Where the contenders' networks run (`fnrl bench --device`), passed to the subprocesses."""


def device() -> str:
    return os.environ.get(DEVICE_VAR, "cpu")


def _steady(marks: list[tuple[int, float]], total_steps: int, warmup_steps: int = 0) -> tuple[float, float]:
    """(steady SPS over the marks in the second half of the steps after `warmup_steps` (random
    actions, no updates), seconds the earlier marks took beyond that rate)."""
    half = warmup_steps + (total_steps - warmup_steps) / 2
    base = max((m for m in marks if m[0] <= half), key=lambda m: m[0], default=marks[0])
    last = marks[-1]
    sps = (last[0] - base[0]) / max(last[1] - base[1], 1e-9)
    warmup = max(0.0, base[1] - base[0] / sps)
    return sps, warmup


def run_fnrl(w: Workload, steps: int, compile: bool, threads: int) -> dict:
    from fnrl import algos

    config = type(algos.default_config(w.algo))(**{**_config_fields(w.algo), **w.config, "total_steps": steps})
    per_collect = config.num_envs * config.num_steps
    kwargs = dict(w.train_kwargs)
    if device() != "cpu":   # on a GPU: CUDA graphs where the run allows them (tried first, refused before work)
        kwargs.update(device=device(), cuda_graphs=compile)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = _train_graphed_where_allowed(w.algo, config, seed=1, log_dir=Path(tmp) / "run", compile=compile,
                                              quiet=True, tensorboard=False, plot=False, threads=threads,
                                              checkpoint_every=steps, log_interval=max(per_collect, steps // 50),
                                              **kwargs)
        wall = time.perf_counter() - t0
    walls = {}
    for r in result.history:   # a vmapped run logs one row per seed per interval
        walls[r["env_steps"]] = max(walls.get(r["env_steps"], 0.0), r["wall_s"])
    marks = [(0, 0.0)] + sorted(walls.items())
    sps, warmup = _steady(marks, steps, w.config.get("learning_starts", 0))
    sps *= w.rows
    returns = [r["return_mean"] for r in result.history if r["return_mean"] == r["return_mean"]]
    return {"sps": sps, "warmup_s": warmup, "wall_s": wall, "return": returns[-1] if returns else None,
            "best_return": max(returns) if returns else None}


def _train_graphed_where_allowed(algo: str, config, **kwargs):
    """`fnrl.train.train`, again without `cuda_graphs` where a run refuses them (a vmapped or
    Atari run, another sampler: a one-line ConfigError before any work)."""
    from fnrl.errors import ConfigError
    from fnrl.train import train

    try:
        return train(algo, config, **kwargs)
    except ConfigError as e:
        if not kwargs.get("cuda_graphs") or "--cuda-graphs" not in str(e):
            raise
        return train(algo, config, **{**kwargs, "cuda_graphs": False})


def _config_fields(algo: str) -> dict:
    from dataclasses import asdict

    from fnrl import algos

    return asdict(algos.default_config(algo))


def run_raw(w: Workload, seconds: float = 3.0) -> dict:
    import numpy as np

    from fnrl import envs

    num_envs = w.config.get("num_envs", _config_fields(w.algo)["num_envs"]) * w.rows
    env = envs.make(w.config["env_id"], num_envs, seed=0)
    raw, rng, spec = env.raw, np.random.default_rng(0), env.spec
    n = env.num_envs
    if spec.discrete:
        def action():
            return rng.integers(0, spec.num_actions, size=n, dtype=np.int32)
    else:
        low = np.broadcast_to(np.asarray(spec.action_low, dtype=np.float64), (n, *spec.action_shape))
        high = np.broadcast_to(np.asarray(spec.action_high, dtype=np.float64), (n, *spec.action_shape))

        def action():
            return rng.uniform(low, high)
    raw.reset()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            raw.step(action())
        steps += 20 * n
    sps = steps / (time.perf_counter() - t0)
    env.close()
    return {"sps": sps}


def linear_lr(lr: float):
    """SB3's learning rate decayed linearly to 0 over the run (CleanRL's anneal_lr)."""
    return lambda progress_remaining: lr * progress_remaining


def sb3_ppo(env, lr=2.5e-4, **kw):
    """SB3's PPO on `env` with CleanRL's CartPole settings (128 steps x 4 minibatches x 4 epochs)."""
    import torch
    from stable_baselines3 import PPO

    return PPO("MlpPolicy", env, n_steps=128, batch_size=128 * env.num_envs // 4, n_epochs=4,
               learning_rate=linear_lr(lr), gamma=0.99, gae_lambda=0.95, ent_coef=0.01, vf_coef=0.5,
               clip_range=0.2, clip_range_vf=0.2, max_grad_norm=0.5,
               policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh),
               device=device(), seed=1, verbose=0, **kw)


def sb3_ppo_default_cartpole(w: Workload):
    """SB3's PPO on fnrl's default CartPole config, rl-zoo3's hyperparams/ppo.yml (CartPole-v1)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=8, seed=1)
    return PPO("MlpPolicy", env, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8,
               learning_rate=linear_lr(1e-3), clip_range=linear_lr(0.2), ent_coef=0.0, device=device(), seed=1,
               verbose=0)


def sb3_ppo_cartpole(w: Workload):
    from stable_baselines3.common.env_util import make_vec_env

    return sb3_ppo(make_vec_env("CartPole-v1", n_envs=w.config["num_envs"], seed=1), lr=w.config["learning_rate"])


def sb3_pong_envs(n_envs: int):
    """SB3's Pong: gymnasium's PongNoFrameskip-v4 with SB3's Atari wrappers and 4 stacked frames."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=n_envs, seed=1), n_stack=4)


def sb3_ppo_pong(w: Workload | None = None):
    """SB3's PPO on Pong with CleanRL's Atari settings (8 envs x 128 steps)."""
    from stable_baselines3 import PPO

    return PPO("CnnPolicy", sb3_pong_envs(8), n_steps=128, batch_size=256, n_epochs=4, learning_rate=linear_lr(2.5e-4),
               gamma=0.99, gae_lambda=0.95, ent_coef=0.01, vf_coef=0.5, clip_range=0.1, clip_range_vf=0.1,
               max_grad_norm=0.5, device=device(), seed=1, verbose=0)


def sb3_dqn_cartpole(w: Workload):
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    c = w.config
    return DQN("MlpPolicy", make_vec_env("CartPole-v1", n_envs=1, seed=1), learning_rate=c["learning_rate"],
               buffer_size=c["buffer_size"], learning_starts=c["learning_starts"], batch_size=c["batch_size"],
               tau=1.0, gamma=c["gamma"], train_freq=10, gradient_steps=1, target_update_interval=500,
               exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
               policy_kwargs=dict(net_arch=list(c["hidden"])), device=device(), seed=1, verbose=0)


def sb3_dqn_pong(w: Workload):
    from stable_baselines3 import DQN

    c = w.config
    every = round(1 / c["replay_ratio"])   # env steps per update (SB3 counts its target period in env steps)
    return DQN("CnnPolicy", sb3_pong_envs(1), learning_rate=c["learning_rate"], buffer_size=c["buffer_size"],
               learning_starts=c["learning_starts"], batch_size=c["batch_size"], tau=1.0, gamma=c["gamma"],
               train_freq=every, gradient_steps=1, target_update_interval=every * c["target_update_interval"],
               exploration_fraction=c["eps_steps"] / w.steps, exploration_initial_eps=1.0,
               exploration_final_eps=c["eps_final"], optimize_memory_usage=False, device=device(), seed=1,
               verbose=0)


def sb3_sac_halfcheetah(w: Workload):
    from stable_baselines3 import SAC

    c = w.config
    return SAC("MlpPolicy", c["env_id"], learning_rate=3e-4, buffer_size=c["buffer_size"],
               batch_size=c["batch_size"], learning_starts=c["learning_starts"], train_freq=1, gradient_steps=1,
               gamma=c["gamma"], tau=c["tau"], ent_coef="auto", policy_kwargs=dict(net_arch=list(c["hidden"])),
               device=device(), seed=1, verbose=0)


SB3_MODELS = {"ppo_cartpole": sb3_ppo_cartpole, "ppo_default_cartpole": sb3_ppo_default_cartpole,
              "ppo_pong": sb3_ppo_pong, "dqn_cartpole": sb3_dqn_cartpole,
              "dqn_pong": sb3_dqn_pong, "sac_halfcheetah": sb3_sac_halfcheetah}


def sb3_clock():
    """An SB3 callback whose `marks` are (env steps, perf_counter s) at the start of every rollout
    (on- and off-policy alike)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.marks = []

        def _on_rollout_start(self) -> None:
            self.marks.append((self.num_timesteps, time.perf_counter()))

        def _on_step(self) -> bool:
            return True

    return Clock()


def run_sb3(w: Workload, steps: int) -> dict:
    import numpy as np

    model = SB3_MODELS[w.sb3](w)
    clock = sb3_clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=steps, callback=clock)
    t1 = time.perf_counter()
    marks = [(s, t - t0) for s, t in clock.marks] + [(model.num_timesteps, t1 - t0)]
    sps, _ = _steady(marks, steps, w.config.get("learning_starts", 0))
    returns = [ep["r"] for ep in model.ep_info_buffer]
    import stable_baselines3

    return {"sps": sps, "wall_s": t1 - t0, "return": float(np.mean(returns)) if returns else None,
            "version": stable_baselines3.__version__}


def worker(kind: str, key: str, steps: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    w = BY_KEY[key]
    if kind == "raw":
        return run_raw(w)
    if kind == "sb3":
        return run_sb3(w, steps)
    return run_fnrl(w, steps, compile=kind == "compiled", threads=threads)


# --------------------------------------------------------------------------- the suite (parent side)


def _measure(kind: str, w: Workload, steps: int, threads: int, timeout: float, dev: str = "cpu") -> dict:
    env = {**os.environ, DEVICE_VAR: dev}
    if kind == "compiled":
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # a cold compile, as on a fresh machine
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, w.key, str(steps), str(threads)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def machine(threads: int) -> str:
    import envpool
    import torch

    sys.path.insert(0, str(HERE))
    from machine import cpu_model

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)"
    return (f"nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: {gpu}, torch {torch.__version__} "
            f"({threads} intra-op thread(s)), envpool {envpool.__version__}, Python {platform.python_version()}")


def _fmt(x, digits=0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _cell(r: dict, key="sps") -> str:
    return f"missing: {r['error']}" if "error" in r else _fmt(r.get(key))


def _ratio(a: dict, b: dict) -> str:
    if "error" in a or "error" in b or not b.get("sps"):
        return "–"
    return f"{a['sps'] / b['sps']:.2f}x"


CONTENDERS = ("raw", "compiled", "eager", "sb3")


def run_suite(quick: bool = False, only: list[str] | None = None, threads: int = 1, out: Path | None = OUTPUT,
              timeout: float = 1800.0, echo=print, steps: int | None = None,
              contenders: tuple[str, ...] = CONTENDERS, device: str = "cpu") -> str:
    """Run the workloads (all, or `only` these keys; `quick`: shorter runs, no eager column, no
    Atari or MuJoCo) and return
    the markdown report (also written to `out` unless None). `steps` overrides every workload's
    length; `contenders` picks columns (the others show as not run). `device`: where fnrl's and
    SB3's networks run ("cuda": fnrl compiled with CUDA graphs where a run allows them)."""
    import torch

    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device}; choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: this machine has no CUDA device; use --device cpu")
    bad = set(contenders) - set(CONTENDERS)
    if bad:
        raise ValueError(f"unknown contender(s) {', '.join(sorted(bad))}; choose from {', '.join(CONTENDERS)}")
    chosen = [w for w in WORKLOADS if (only is None or w.key in only) and (not quick or w.quick_steps)]
    unknown = set(only or ()) - set(BY_KEY)
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from {', '.join(BY_KEY)}")
    started, load_start = time.perf_counter(), _load()
    rows = []
    for w in chosen:
        n = steps or (w.quick_steps if quick else w.steps)
        r = {"w": w, "steps": n}
        for kind in CONTENDERS:
            if quick and kind == "eager" and steps is None:
                r[kind] = {"error": "not run (--quick)"}
                continue
            if kind not in contenders or kind not in w.contenders or (kind == "sb3" and w.sb3 is None):
                r[kind] = {"error": "not run"}
                continue
            echo(f"[bench] {w.key}: {kind} ({n:,} steps) ...")
            r[kind] = _measure(kind, w, n, threads, timeout, device)
            echo(f"[bench] {w.key}: {kind} -> {_cell(r[kind])} SPS")
        r["load"] = _load()
        rows.append(r)
    lines = [
        "# fnrl benchmark suite" + (" (--quick)" if quick else ""), "",
        f"Machine: {machine(threads)}.",
        *([f"Device: {device} (fnrl's and SB3's networks, replay and updates; fnrl compiled with CUDA graphs "
           "where a run allows them; the envs step on the CPU)."] if device != "cpu" else []),
        f"Load average (1/5/15 min) at start: {load_start}; whole suite: {time.perf_counter() - started:.0f} s.", "",
        "SPS = env steps (all envs) per second of wall time in the second half of each run, updates "
        "included. Every contender ran in its own process, one after the other, with the same torch thread "
        "count. `compile s` = the extra time of the first half over the steady rate (mostly the cold "
        "`torch.compile`). Peers not installed show as missing. Generated by `fnrl bench"
        + (" --quick" if quick else "") + "`.", "",
        "| workload | steps | raw env | fnrl compiled | compile s | fnrl eager | stable-baselines3 | "
        "compiled / SB3 | compiled / eager | compiled / raw | return (compiled / SB3) | load after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        c, e, s, raw = r["compiled"], r["eager"], r["sb3"], r["raw"]
        ret = f"{_fmt(c.get('return'), 1)} / {_fmt(s.get('return'), 1)}"
        lines.append(f"| {r['w'].key} | {r['steps']:,} | {_cell(raw)} | {_cell(c)} | {_cell(c, 'warmup_s')} | "
                     f"{_cell(e)} | {_cell(s)} | {_ratio(c, s)} | {_ratio(c, e)} | {_ratio(c, raw)} | {ret} | "
                     f"{r['load']} |")
    by_key = {r["w"].key: r for r in rows}
    for suffix, how in (("", ""), ("-graph", " with the graph sampler")):
        one, eight = f"ppo-default-1seed{suffix}", f"ppo-default-8seeds{suffix}"
        if {one, eight} <= set(by_key):
            ratio = _ratio(by_key[eight]["compiled"], by_key[one]["compiled"])
            lines += ["", f"**Vmapped seeds{how}:** 8 seeds in one process / 1 seed, total env steps per second "
                          f"(compiled): **{ratio}** (target 4x)."]
    for key in ("ppo-cartpole-64-lr", "ppo-cartpole-64-lr-graph"):
        c = by_key[key]["compiled"] if key in by_key else {"error": "not run"}
        if "error" not in c:
            reached, last = c.get("best_return") or 0, c.get("return") or 0
            verdict = ("met at the end of the run" if c["sps"] >= 120_000 and last >= 475 else
                       "met during the run, not at its end" if c["sps"] >= 120_000 and reached >= 475 else "not met")
            lines += ["", f"**64-env milestone:** `{key}` compiled at {_fmt(c['sps'])} SPS, last "
                          f"return_mean {_fmt(c.get('return'), 1)}, best {_fmt(c.get('best_return'), 1)} (target: "
                          f"120,000 SPS while reaching 475; purejaxrl 170k): {verdict}."]
    lines += ["", "Settings:", ""] + [f"- `{r['w'].key}`: {r['w'].note}." for r in rows]
    lines += ["", "Peers measured earlier on the same kind of machine (not re-run here): purejaxrl PPO CartPole "
              "121k SPS at 4 envs, 170k at 64 envs; CleanRL PPO CartPole 3.9k, DQN CartPole 3.6k, "
              "PPO Pong 306, SAC HalfCheetah ~80."]
    report = "\n".join(lines) + "\n"
    if out is not None:
        Path(out).write_text(report)
    return report


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--learning" in argv:   # the learning matrix (benchmarks/learning.py)
        sys.path.insert(0, str(HERE))
        import learning

        return learning.main([a for a in argv if a != "--learning"])
    p = argparse.ArgumentParser(prog="fnrl bench", description="Run the benchmark suite and print one table "
                                "(--learning: the learning matrix, see benchmarks/learning.py).")
    p.add_argument("--quick", action="store_true", help="shorter runs, no eager column, no Atari or MuJoCo "
                   "(about 10 min on 2 cores)")
    p.add_argument("--only", default=None, help=f"comma-separated workloads: {', '.join(BY_KEY)}")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of every contender (default: 1)")
    p.add_argument("--out", default=None, help=f"markdown report path (default: {OUTPUT.name}, with --quick "
                   f"{QUICK_OUTPUT.name}, in {HERE})")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per contender before it is cut off")
    p.add_argument("--steps", type=int, default=None, help="env steps of every run (default: each workload's)")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated columns to measure")
    p.add_argument("--device", default="cpu", help="where the networks run: cpu (default) or cuda")
    p.add_argument("--worker", nargs=4, metavar=("KIND", "KEY", "STEPS", "THREADS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        kind, key, steps, threads = args.worker
        print(json.dumps(worker(kind, key, int(steps), int(threads))))
        return 0
    only = args.only.split(",") if args.only else None
    out = Path(args.out) if args.out else (QUICK_OUTPUT if args.quick else OUTPUT)
    print(run_suite(args.quick, only, args.threads, out, args.timeout, steps=args.steps,
                    contenders=tuple(args.contenders.split(",")), device=args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
