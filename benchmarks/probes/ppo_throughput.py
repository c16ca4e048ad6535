"""PPO throughput: fnrl (compiled and eager) vs stable-baselines3, with EnvPool as the ceiling.

One run, side by side, on one machine (described at the top of the output):

1. PPO CartPole-v1, CleanRL ppo.py settings (4 envs x 128 steps, 4 epochs x 4 minibatches,
   lr 2.5e-4 annealed, gamma 0.99, GAE lambda 0.95, ent 0.01, clip 0.2 not annealed, clipped
   value loss, 64-64 tanh MLPs), 100k env steps: env steps per second including updates for
   fnrl compiled (whole run including compile time, and steady state = the second half of
   training from progress.csv), fnrl eager, and stable-baselines3 PPO on the same settings
   (gymnasium CartPole-v1 in a DummyVecEnv, device cpu); final returns; ratios fnrl / SB3.
2. PPO Pong, CleanRL ppo_atari_envpool.py settings (8 envs x 128, 4 epochs x 4 minibatches,
   lr 2.5e-4, ent 0.01, clip 0.1, vf 0.5, Nature CNN) for a few iterations after warm-up:
   fnrl (EnvPool Pong-v5) compiled and eager, SB3 (ALE PongNoFrameskip-v4 with
   make_atari_env + VecFrameStack(4)).
3. Raw EnvPool random-action steps per second (the ceiling), and the rollout cost: one
   [128, 64] CartPole rollout with the PPO policy through `SerialSampler` (eager act and
   `torch.compile(act)`) vs 128 random-action steps of the same raw envs.
4. Where a training iteration's time goes: policy forward (act), the raw EnvPool step, the
   env adaptor (numpy <-> torch, flags, episode statistics), the sampler's own writes, and
   the update, for CartPole 4 x 128 and 64 x 128, compiled and eager.

fnrl's compile time is measured cold: Inductor's on-disk cache is pointed at a fresh temporary
folder unless --warm-cache is given. Writes benchmarks/probes/ppo_throughput.md (or --out).

    python benchmarks/probes/ppo_throughput.py [--threads 1] [--quick] [--skip-sb3] [--warm-cache]
"""
from __future__ import annotations

import argparse
import atexit
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fnrl import envs
from fnrl.algos import ppo
from fnrl.samplers import SerialSampler
from fnrl.train import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine, suite
from machine import cpu_model  # noqa: E402
from suite import sb3_clock, sb3_ppo, sb3_ppo_pong  # noqa: E402  (SB3's models, as the suite runs them)

OUTPUT = Path(__file__).with_suffix(".md")

CARTPOLE = dict(env_id="CartPole-v1", total_steps=100_000, num_envs=4, num_steps=128, learning_rate=2.5e-4,
                anneal_lr=True, gamma=0.99, gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.2,
                anneal_clip=False, clip_vloss=True, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5,
                hidden=(64, 64), activation="tanh")
PONG = dict(env_id="Pong-v5", num_envs=8, num_steps=128, learning_rate=2.5e-4, anneal_lr=True, gamma=0.99,
            gae_lambda=0.95, num_minibatches=4, update_epochs=4, clip_coef=0.1, anneal_clip=False, clip_vloss=True,
            ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, conv="nature")
PEERS_SB3_PONG = "271-281"  # SB3 PPO Pong 8 envs x 128, measured earlier on a 2-core machine


# ---------------------------------------------------------------------------
# machine
# ---------------------------------------------------------------------------


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    import envpool

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)"
    try:
        import stable_baselines3

        sb3 = stable_baselines3.__version__
    except ImportError:
        sb3 = "not installed"
    return (f"nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: {gpu}, torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op threads), envpool {envpool.__version__}, "
            f"stable-baselines3 {sb3}, Python {platform.python_version()}")


# ---------------------------------------------------------------------------
# timing helpers
# ---------------------------------------------------------------------------


class Timers(dict):
    """Accumulated seconds by name; `wrap(fn, name)` returns `fn` timed into `name`."""

    def wrap(self, fn, name):
        self.setdefault(name, 0.0)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            self[name] += time.perf_counter() - t
            return out

        return timed


class _TimedRaw:
    """Stands in for an EnvPool env, timing its `step` (the C++ stepping alone; `_send` and
    `_recv` where fnrl.envs.batched.EnvPoolCalls calls them directly)."""

    def __init__(self, raw, timers: Timers):
        self._raw = raw
        self.step = timers.wrap(raw.step, "raw_env")
        self._send = timers.wrap(raw._send, "raw_env")
        self._recv = timers.wrap(raw._recv, "raw_env")

    def __getattr__(self, name):
        return getattr(self._raw, name)


def instrument(env, act, timers: Timers):
    """Time `act`, the adaptor's `env.step` and EnvPool's own step on this env instance."""
    env.raw = _TimedRaw(env.raw, timers)
    env.step = timers.wrap(env.step, "env_step")
    return timers.wrap(act, "act")


def random_actions(env, rng):
    n = env.raw.action_space.n
    return rng.integers(0, n, size=env.num_envs, dtype=np.int32)


def raw_sps(env_id: str, num_envs: int, seconds: float) -> float:
    """Random-action steps per second (env steps, all envs) of the raw EnvPool env."""
    env = envs.make(env_id, num_envs=num_envs, seed=0)
    raw, rng = env.raw, np.random.default_rng(0)
    raw.reset()
    for _ in range(10):
        raw.step(random_actions(env, rng))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            raw.step(random_actions(env, rng))
        steps += 20
    sps = steps * num_envs / (time.perf_counter() - t0)
    env.close()
    return sps


# ---------------------------------------------------------------------------
# training runs
# ---------------------------------------------------------------------------


def fnrl_run(config: ppo.Config, compile: bool, threads: int, steady_from: int) -> dict:
    """`fnrl.train` PPO; sps over the whole run and over the rows after env step `steady_from`."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        result = train("ppo", config, seed=1, log_dir=Path(tmp) / "run", compile=compile, quiet=True,
                       tensorboard=False, plot=False, threads=threads, checkpoint_every=config.total_steps)
        total_wall = time.perf_counter() - t0
    rows = result.history
    last = rows[-1]
    base = max((r for r in rows if r["env_steps"] <= steady_from), key=lambda r: r["env_steps"],
               default=rows[0])
    steady = (last["env_steps"] - base["env_steps"]) / (last["wall_s"] - base["wall_s"])
    returns = [r["return_mean"] for r in rows if np.isfinite(r["return_mean"])]
    return {"steps": last["env_steps"], "sps_all": last["env_steps"] / last["wall_s"], "sps_steady": steady,
            "steady_steps": last["env_steps"] - base["env_steps"], "wall": last["wall_s"],
            "total_wall": total_wall, "return": returns[-1] if returns else float("nan"), "load": load()}


def sb3_learn(model, total_steps: int, steady_from: int) -> dict:
    clock = sb3_clock()
    t0 = time.perf_counter()
    model.learn(total_timesteps=total_steps, callback=clock)
    t1 = time.perf_counter()
    steps = model.num_timesteps
    base_steps, base_t = max((m for m in clock.marks if m[0] <= steady_from), key=lambda m: m[0])
    returns = [ep["r"] for ep in model.ep_info_buffer]
    return {"steps": steps, "sps_all": steps / (t1 - t0), "sps_steady": (steps - base_steps) / (t1 - base_t),
            "steady_steps": steps - base_steps, "wall": t1 - t0, "total_wall": t1 - t0,
            "return": float(np.mean(returns)) if returns else float("nan"), "load": load()}


def sb3_cartpole(total_steps: int, steady_from: int) -> dict:
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=4, seed=1)  # DummyVecEnv of gymnasium CartPole-v1
    out = sb3_learn(sb3_ppo(env), total_steps, steady_from)
    env.close()
    return out


def sb3_pong(total_steps: int, steady_from: int) -> dict:
    model = sb3_ppo_pong()
    out = sb3_learn(model, total_steps, steady_from)
    model.get_env().close()
    return out


def guarded(fn, *args):
    """Run a peer measurement; on failure return the reason instead of stopping the benchmark."""
    try:
        return fn(*args)
    except Exception as e:  # a missing ROM or package must not lose the other numbers
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}


# ---------------------------------------------------------------------------
# rollout cost and breakdown
# ---------------------------------------------------------------------------


def make_agent(config: ppo.Config, spec, compile: bool):
    """As fnrl.train builds it: compiled update pieces and a compiled `act`."""
    agent = ppo.make(config, spec, compile=compile)
    if compile:
        agent = agent._replace(act=torch.compile(agent.act, fullgraph=True))
    return agent


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def rollout_cost(num_envs: int, horizon: int, reps: int) -> dict:
    """Median seconds for one [horizon, num_envs] CartPole rollout: raw random steps, sampler eager / compiled."""
    config = ppo.Config(**{**CARTPOLE, "num_envs": num_envs, "num_steps": horizon})
    env = envs.make("CartPole-v1", num_envs=num_envs, seed=0)
    rng = np.random.default_rng(0)
    raw = env.raw

    def random_rollout():
        for _ in range(horizon):
            raw.step(random_actions(env, rng))

    out = {}
    for compile in (False, True):
        torch._dynamo.reset()
        agent = make_agent(config, env.spec, compile)
        state = agent.init(0)
        sampler = SerialSampler(env, agent.act, horizon)
        sampler.collect(state)  # allocation, compile
        sampler.collect(state)
        name = "compiled" if compile else "eager"
        # alternate raw and sampler rounds so that a neighbour's load hits both alike
        raw_t, sam_t = [], []
        for _ in range(reps):
            raw_t.append(median_time(random_rollout, 1))
            sam_t.append(median_time(lambda: sampler.collect(state), 1))
        out[name] = statistics.median(sam_t)
        out.setdefault("raw", []).extend(raw_t)
        out[f"{name} breakdown"] = collect_breakdown(config, agent, state, reps)
    out["raw"] = statistics.median(out["raw"])
    out["load"] = load()
    env.close()
    return out


def collect_breakdown(config: ppo.Config, agent, state, reps: int) -> dict:
    """Seconds per collect in act, raw env, adaptor and sampler writes, on a fresh instrumented env."""
    env = envs.make(config.env_id, num_envs=config.num_envs, seed=0)
    timers = Timers()
    sampler = SerialSampler(env, instrument(env, agent.act, timers), config.num_steps)
    collect = timers.wrap(sampler.collect, "collect")
    collect(state)
    timers.update({k: 0.0 for k in timers})
    t0 = time.perf_counter()
    for _ in range(reps):
        collect(state)
    total = time.perf_counter() - t0
    env.close()
    return split(timers, reps, total, config.num_steps * config.num_envs)


def split(timers: Timers, iterations: int, total: float, steps_per_iteration: int) -> dict:
    per = {k: v / iterations for k, v in timers.items()}
    update = per.get("update", 0.0)
    return {
        "act": per["act"], "raw_env": per["raw_env"], "adaptor": per["env_step"] - per["raw_env"],
        "sampler": per["collect"] - per["act"] - per["env_step"], "update": update,
        "rest": total / iterations - per["collect"] - update, "total": total / iterations,
        "sps": steps_per_iteration * iterations / total, "load": load(),
    }


def breakdown(config: ppo.Config, compile: bool, iterations: int, warmup: int = 2) -> dict:
    """Seconds per iteration in act, raw env, adaptor, sampler writes, update, for collect -> update."""
    torch._dynamo.reset()
    env = envs.make(config.env_id, num_envs=config.num_envs, seed=0)
    agent = make_agent(config, env.spec, compile)
    state = agent.init(0)
    timers = Timers()
    act = instrument(env, agent.act, timers)
    sampler = SerialSampler(env, act, config.num_steps)
    collect = timers.wrap(sampler.collect, "collect")
    update = timers.wrap(agent.update, "update")
    n = config.num_steps * config.num_envs

    def iteration():
        nonlocal state
        rollout = collect(state)
        state["env_steps"] += n
        state, _ = update(state, rollout)

    for _ in range(warmup):
        iteration()
    timers.update({k: 0.0 for k in timers})
    t0 = time.perf_counter()
    for _ in range(iterations):
        iteration()
    total = time.perf_counter() - t0
    env.close()
    return split(timers, iterations, total, n)


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def fmt(x, digits=0) -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:,.{digits}f}"


def verdict(ratio, target) -> str:
    return f"{ratio:.2f}x {'✓' if ratio >= target else '✗ (target ' + str(target) + 'x)'}"


def train_table(title: str, runs: dict, sb3_key: str, target: float, sb3_fallback: str | None = None,
                with_return: bool = True) -> list[str]:
    lines = [f"### {title}", "",
             "| run | env steps | wall s | SPS incl. compile | SPS steady | steady over | final return | load avg |"
             " ratio vs SB3 (incl. / steady) |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    sb3 = runs.get(sb3_key, {})
    sb3_ok = "error" not in sb3 and sb3
    for name, r in runs.items():
        if "error" in r:
            lines.append(f"| {name} | – | – | – | – | – | – | – | not measured: {r['error']} |")
            continue
        ratio = "–"
        if name != sb3_key and sb3_ok:
            ratio = f"{verdict(r['sps_all'] / sb3['sps_all'], target)} / {verdict(r['sps_steady'] / sb3['sps_steady'], target)}"
        elif name != sb3_key and sb3_fallback:
            lo, hi = (float(x) for x in sb3_fallback.split("-"))
            ratio = (f"{r['sps_all'] / hi:.2f}-{r['sps_all'] / lo:.2f}x / {r['sps_steady'] / hi:.2f}-"
                     f"{r['sps_steady'] / lo:.2f}x vs SB3 measured earlier ({'✓' if r['sps_steady'] / hi >= target else '✗'}"
                     f" target {target}x)")
        ret = fmt(r["return"], 1) if with_return else "–"
        lines.append(f"| {name} | {r['steps']:,} | {r['wall']:.1f} | {fmt(r['sps_all'])} | {fmt(r['sps_steady'])} | "
                     f"last {r['steady_steps']:,} steps | {ret} | {r['load']} | {ratio} |")
    if sb3_fallback and not sb3_ok:
        lines.append(f"| stable-baselines3 PPO (measured earlier, not this run) | – | – | – | {sb3_fallback} | – | – | – | – |")
    return lines + [""]


def breakdown_table(rows: dict) -> list[str]:
    lines = ["| loop | act | raw EnvPool step | env adaptor | sampler writes | update | rest | total ms/iter | SPS |"
             " load avg |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, b in rows.items():
        cells = " | ".join(f"{1e3 * b[k]:.1f} ({100 * b[k] / b['total']:.0f}%)"
                           for k in ("act", "raw_env", "adaptor", "sampler", "update", "rest"))
        lines.append(f"| {name} | {cells} | {1e3 * b['total']:.1f} | {fmt(b['sps'])} | {b['load']} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="20k CartPole steps, 1+2 Pong iterations")
    parser.add_argument("--skip-sb3", action="store_true", help="do not run stable-baselines3")
    parser.add_argument("--warm-cache", action="store_true",
                        help="use Inductor's usual on-disk cache (default: a fresh one, so compile time is cold)")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()

    if not args.warm_cache:
        cache = tempfile.mkdtemp(prefix="fnrl_ppo_bench_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
    torch.set_num_threads(args.threads)
    cart_steps = 20_000 if args.quick else 100_000
    pong_warmup, pong_iters = (1, 2) if args.quick else (1, 3)
    raw_seconds, reps, bd_iters = (1.0, 5, 5) if args.quick else (3.0, 15, 20)
    t_start, load_start = time.perf_counter(), load()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.0f}s load {load()}] {msg}", file=sys.stderr, flush=True)

    # 3. ceilings first (cheap, and they tell how busy the machine is)
    log("raw EnvPool")
    ceilings = {f"{env_id} x {n}": raw_sps(env_id, n, raw_seconds)
                for env_id, n in (("CartPole-v1", 4), ("CartPole-v1", 64), ("Pong-v5", 8))}

    # 1. CartPole training
    cart = ppo.Config(**{**CARTPOLE, "total_steps": cart_steps})
    cart_runs = {}
    log("CartPole fnrl compiled")
    torch._dynamo.reset()
    cart_runs["fnrl compiled"] = fnrl_run(cart, True, args.threads, cart_steps // 2)
    log("CartPole fnrl eager")
    cart_runs["fnrl eager"] = fnrl_run(cart, False, args.threads, cart_steps // 2)
    if not args.skip_sb3:
        log("CartPole SB3")
        cart_runs["stable-baselines3 PPO"] = guarded(sb3_cartpole, cart_steps, cart_steps // 2)
        torch.set_num_threads(args.threads)

    # 2. Pong training: warm-up iterations, then the measured ones
    n_pong = PONG["num_envs"] * PONG["num_steps"]
    pong = ppo.Config(**{**PONG, "total_steps": (pong_warmup + pong_iters) * n_pong})
    pong_runs = {}
    log("Pong fnrl compiled")
    torch._dynamo.reset()
    pong_runs["fnrl compiled"] = fnrl_run(pong, True, args.threads, pong_warmup * n_pong)
    log("Pong fnrl eager")
    pong_runs["fnrl eager"] = fnrl_run(pong, False, args.threads, pong_warmup * n_pong)
    if not args.skip_sb3:
        log("Pong SB3")
        pong_runs["stable-baselines3 PPO"] = guarded(sb3_pong, pong.total_steps, pong_warmup * n_pong)
        torch.set_num_threads(args.threads)

    # 3b. rollout cost, 4. breakdown
    log("rollout cost")
    cost = rollout_cost(64, 128, reps)
    bd = {}
    for compile in (True, False):
        log(f"breakdown compiled={compile}")
        bd[f"train, CartPole 4 x 128, {'compiled' if compile else 'eager'}"] = breakdown(cart, compile, bd_iters)
    for name in ("compiled", "eager"):
        bd[f"collect only, CartPole 64 x 128, {name} act"] = cost[f"{name} breakdown"]
    log("done")

    # ------------------------------------------------------------------ report
    pong_fallback = None
    sb3_pong_run = pong_runs.get("stable-baselines3 PPO")
    if sb3_pong_run is None or "error" in sb3_pong_run:
        pong_fallback = PEERS_SB3_PONG
    lines = [
        "# PPO throughput: fnrl vs stable-baselines3, EnvPool as the ceiling", "",
        f"Machine: {machine()}.",
        f"Load average (1/5/15 min) at start: {load_start}; at end: {load()}. "
        f"Whole benchmark: {time.perf_counter() - t_start:.0f} s{' (--quick)' if args.quick else ''}. "
        f"Inductor cache: {'the usual warm one' if args.warm_cache else 'fresh (cold compile)'}.", "",
        "SPS = env steps (all envs together) per second of wall time, updates included. "
        "`SPS incl. compile` is the whole run (fnrl: `wall_s` of the last progress.csv row; the first "
        "`torch.compile` happens inside it); `SPS steady` is over the rows after the warm-up "
        "(CartPole: the second half of training; Pong: after the warm-up iterations). "
        "fnrl runs through `fnrl.train.train` (seed 1, quiet, no TensorBoard, one checkpoint at the end), "
        "`compile=True` compiles `act` and PPO's update pieces with `fullgraph=True`. "
        "Final return: fnrl = mean return of the episodes that ended in the last log interval (~1% of "
        "training); SB3 = mean of its last 100 episodes (`ep_info_buffer`). "
        "✓ / ✗ = target met / missed.", "",
        "## 1. PPO CartPole-v1, CleanRL ppo.py settings", "",
        "4 envs x 128 steps, 4 epochs x 4 minibatches, lr 2.5e-4 annealed linearly, gamma 0.99, GAE lambda 0.95, "
        "ent 0.01, clip 0.2 (not annealed), clipped value loss, max grad norm 0.5, 64-64 tanh actor and critic. "
        "fnrl: EnvPool CartPole-v1. SB3: `PPO(\"MlpPolicy\", n_steps=128, batch_size=128, n_epochs=4, "
        "learning_rate=linear 2.5e-4, clip_range=0.2, clip_range_vf=0.2, ent_coef=0.01, "
        "net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=Tanh, device=\"cpu\")` on its own "
        "gymnasium CartPole-v1 in a DummyVecEnv (`make_vec_env`, 4 envs). Target: fnrl >= 3x SB3.", "",
        *train_table(f"{cart_steps:,} env steps", cart_runs, "stable-baselines3 PPO", 3.0),
        "## 2. PPO Pong, CleanRL ppo_atari_envpool.py settings", "",
        "8 envs x 128 steps, 4 epochs x 4 minibatches (minibatch 256), lr 2.5e-4, ent 0.01, clip 0.1, vf 0.5, "
        "clipped value loss, Nature CNN. fnrl: EnvPool Pong-v5 (84x84, 4-frame stack, frame skip 4, episodic "
        "life, reward clipping). SB3: `make_atari_env(\"PongNoFrameskip-v4\", n_envs=8)` + `VecFrameStack(4)` "
        "(ALE, DummyVecEnv), `PPO(\"CnnPolicy\", n_steps=128, batch_size=256, n_epochs=4, clip_range=0.1, "
        f"clip_range_vf=0.1, device=\"cpu\")`. {pong_warmup} warm-up iteration(s), then {pong_iters} measured "
        "iterations (`SPS steady`). Target: fnrl >= 1.5x SB3.", "",
        *train_table(f"{pong_warmup} + {pong_iters} iterations of {n_pong} env steps", pong_runs,
                     "stable-baselines3 PPO", 1.5, pong_fallback, with_return=False),
        "## 3. Ceiling and rollout cost", "",
        "Raw EnvPool (`env_type=\"gymnasium\"`), random actions, no policy, no torch:", "",
        "| env | SPS |", "|---|---:|",
        *(f"| {k} | {fmt(v)} |" for k, v in ceilings.items()), "",
        f"One [128, 64] CartPole-v1 rollout (median of {reps}, the contenders in alternating rounds; load avg "
        f"{cost['load']}): `SerialSampler(env, agent.act, 128).collect(state)` with the PPO policy vs "
        "128 `env.raw.step(random actions)` on the same envs. Target: at most 1.5x.", "",
        "| rollout | ms | SPS | x raw |", "|---|---:|---:|---|",
        f"| raw EnvPool, random actions | {1e3 * cost['raw']:.1f} | {fmt(128 * 64 / cost['raw'])} | 1.00x |",
        *(f"| SerialSampler, {k} act | {1e3 * cost[k]:.1f} | {fmt(128 * 64 / cost[k])} | "
          f"{cost[k] / cost['raw']:.2f}x {'✓' if cost[k] / cost['raw'] <= 1.5 else '✗ (target 1.5x)'} |"
          for k in ("eager", "compiled")), "",
        "## 4. Where an iteration's time goes", "",
        f"`train`: collect -> update with the CleanRL CartPole settings, timed over {bd_iters} iterations after "
        "2 warm-up ones; `collect only`: the [128, 64] rollouts of section 3 on a second, instrumented env "
        f"({reps} collects). Milliseconds per iteration (share of the iteration). `act` = the policy "
        "forward and sampling (compiled or eager); `raw EnvPool step` = EnvPool's C++ step; `env adaptor` = "
        "fnrl.envs' work around it (action to numpy, numpy to torch, done/valid flags, episode statistics); "
        "`sampler writes` = SerialSampler's per-step writes into the rollout buffer and its loop; `update` = "
        "PPO's 4 x 4 minibatch steps (advantages included); `rest` = the loop around them.", "",
        *breakdown_table(bd),
        f"Generated by `python benchmarks/probes/ppo_throughput.py{' --quick' if args.quick else ''}"
        f"{f' --threads {args.threads}' if args.threads != 1 else ''}`. The machine is shared, so absolute "
        "numbers move between runs; the ratios measured side by side are the result.", "",
    ]
    text = "\n".join(lines)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
