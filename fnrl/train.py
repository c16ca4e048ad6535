"""The training loop: collect -> update -> log -> checkpoint.

This is the only module that wires an algorithm to a sampler, a replay buffer and a
logger. It knows two shapes of algorithm:

- on-policy (`KIND = "on_policy"`): collect [T, B] -> `update(state, rollout)`;
- off-policy (`KIND = "off_policy"`): collect [T, B] -> replay.add -> the updates due
  under `replay_ratio` (gradient updates per env step), each on `replay.sample()`.

    result = train("ppo", ppo.Config(total_steps=50_000), seed=1, log_dir="runs/x")
    result.return_mean, result.history, result.state
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from fnrl import algos, aot, envs, rng, samplers
from fnrl.distributed.data_parallel import RowsOnly
from fnrl.episodes import EpisodeStats, returns_by_row
from fnrl.errors import ConfigError
from fnrl.inductor import compile_with_cpp_wrapper_on_cpu
from fnrl.logger import interval_rows
from fnrl.replay import snapshot as replay_snapshot

CHECKPOINT = "checkpoint.pt"
CHECKPOINT_FORMAT = "fnrl-checkpoint-v3"  # v2: PPO/A2C states hold seed, hp and a stored learning rate; v3: DQN/QPG stored rates


class TrainingError(RuntimeError):
    """Training stopped (a NaN in a loss); the last good checkpoint is intact."""


@dataclass
class TrainResult:
    """What `train` returns.

    state: the final training state (rows stacked for a vmapped run).
    return_mean: the trailing mean return (last 100 finished episodes; the mean over rows).
    history: the rows written to progress.csv.
    log_dir: the run folder (None on ranks other than 0).
    eval_returns: the final deterministic evaluation's episode returns, one list per row
        (None where evaluation was off or another process evaluated).
    """

    state: object
    return_mean: float
    history: list
    log_dir: Path
    eval_returns: list | None = None

    @property
    def eval_return_mean(self) -> float:
        """The final evaluation's mean return (the mean of the rows' means; NaN without one)."""
        if not self.eval_returns:
            return math.nan
        return float(np.mean([np.mean(r) for r in self.eval_returns]))


def _default_log_dir(name: str, config, seed: int) -> Path:
    env = config.env_id.replace("/", "_")
    return Path("runs") / f"{name}-{env}-s{seed}-{datetime.now():%Y%m%d-%H%M%S}"


def _prepare_log_dir(log_dir, name, config, seed, resume) -> Path:
    path = Path(log_dir) if log_dir is not None else _default_log_dir(name, config, seed)
    parent = path.resolve().parent
    if log_dir is not None and not parent.is_dir():
        raise ConfigError(f"log dir parent {parent} does not exist; create it or choose another --log-dir")
    if not resume and (path / CHECKPOINT).exists():
        raise ConfigError(f"{path} already holds a run; use --resume {path} to continue it or pick a new --log-dir")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config_json(run_dir: Path, name: str, seed: int, config, preset: str | None, **extra) -> None:
    """The run's `config.json`: algorithm, seed, the preset its config started from (None for the
    defaults), the config, and the loop's own entries (`extra`)."""
    (run_dir / "config.json").write_text(json.dumps(
        {"algo": name, "seed": seed, "preset": preset, **extra, "config": dataclasses.asdict(config)}, indent=2,
        default=str))


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint file (or a run folder holding one), with one-line errors."""
    path = Path(path)
    if path.is_dir():
        path = path / CHECKPOINT
    if not path.exists():
        raise ConfigError(f"no checkpoint at {path}; pass a run folder or its {CHECKPOINT}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or foreign file
        raise ConfigError(f"{path} is not a readable fnrl checkpoint ({type(e).__name__}); it may be corrupt") from e
    tag = ckpt.get("format") if isinstance(ckpt, dict) else None
    if isinstance(tag, str) and tag.startswith("fnrl-checkpoint-") and tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} was written by another fnrl version (format {tag!r}; this one reads "
                          f"{CHECKPOINT_FORMAT!r}); evaluate or resume it with that version, or retrain")
    if tag != CHECKPOINT_FORMAT:
        raise ConfigError(f"{path} is not an fnrl checkpoint (missing format tag {CHECKPOINT_FORMAT!r})")
    return ckpt


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write atomically: a temporary file in the same folder, then rename over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _make_agent(module, config, spec, compile: bool, update_compiled_by_learner: bool = False):
    """`module.make(...)`, compiled: modules that sequence compiled pieces themselves take
    `compile=`; otherwise the whole update is compiled here (unless
    `update_compiled_by_learner`: the fused learner step of `fnrl.learner` compiles it with
    the replay draw, so `update` stays eager here). Acting is compiled too.

    Compiled acting is ahead of time (`fnrl.aot.AotAct`: the sampler's calls go straight to
    an AOTInductor model; 14.5 instead of 43.7 ms of acting per 4-env x 128-step PPO rollout
    in benchmarks/probes/ppo_breakdown.md), with a `torch.compile`d `act` for the calls
    that model does not serve (evaluation, recurrent carries). Off-policy acting is compiled with Inductor's
    `fallback_random`, so it draws exactly the random numbers eager acting draws (same
    exploration as `compile=False`); the `torch.compile`d fallback uses `cpp_wrapper` on the CPU
    (the graph's calls made from C++ instead of a Python wrapper)."""
    if "compile" in inspect.signature(module.make).parameters:
        agent = module.make(config, spec, compile=compile)
    else:
        agent = module.make(config, spec)
        if compile and not update_compiled_by_learner:
            agent = agent._replace(update=torch.compile(agent.update, fullgraph=True, dynamic=False))
    if compile:
        randomness = {"fallback_random": True} if module.KIND == "off_policy" else {}
        act = compile_with_cpp_wrapper_on_cpu(agent.act, randomness, fullgraph=True, dynamic=False)
        keys = getattr(module, "ACT_KEYS", None)
        fallback = act if keys is None else acting_on(keys, act)
        act = aot.AotAct(agent.act, keys, fallback, randomness) if aot.ENABLED else fallback
        agent = agent._replace(act=act)
    return agent


def acting_on(keys, act):
    """`act(state, obs, carry, explore)` that passes on only `state.select(*keys)` (keys missing
    from the state are skipped), for a module that declares the state its `act` reads as
    `ACT_KEYS` (nested keys as tuples, e.g. `("params", "actor")`; `env_steps` included).

    A compiled `act` guards every tensor of its arguments on every call (TorchDynamo's cache
    lookup); given the few tensors it reads instead of the whole training state (parameters,
    target parameters, optimizer moments) the lookup is that much cheaper, with the same result."""
    keys = tuple(keys)

    def act_on_selected(state, obs, carry, explore: bool = True):
        return act(state.select(*keys, strict=False), obs, carry, explore)

    return act_on_selected


SKIP_GUARDS = True
"""Runs with compile=True skip TorchDynamo's guard checks once warm (see `_steady`);
set False to keep them (e.g. while changing an algorithm's act or update)."""


def _steady(warm: bool):
    """Where every compiled function of the loop has run once with the shapes it will keep:
    TorchDynamo skips guard evaluation (`skip_guard_eval_unsafe`), keeping only the guards that
    tell its cache entries apart. The loop calls act, the update (and replay add / sample) with the same
    structures every time, and each call's guard check costs about as much as the math of a small
    network on the CPU. A call that would still need a new graph raises a RuntimeError
    ("Recompilation triggered with skip_guard_eval_unsafe stance") rather than run a wrong one;
    SKIP_GUARDS = False turns this off. Elsewhere (warm False): a no-op context."""
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if warm else contextlib.nullcontext()


class _HeldStance:
    """`_steady`'s stance entered once the loop is warm and kept across its iterations (entering
    and leaving it costs ~7 µs, about 5% of a 10-step DQN iteration's Python); `release` leaves it
    for logging, evaluation and checkpoints, and the next `hold` enters it again."""

    def __init__(self):
        self._stance = None

    def hold(self, warm: bool) -> None:
        if warm and self._stance is None:
            self._stance = _steady(True)
            self._stance.__enter__()

    def release(self) -> None:
        if self._stance is not None:
            stance, self._stance = self._stance, None
            stance.__exit__(None, None, None)


FUSED_LEARNER = True
"""Off-policy runs with compile=True sample and update in one compiled graph, the state donated
(`fnrl.learner`), for a row replay without frame deduplication and one seed; set False for a
separately compiled sample and update (benchmarks/probes/learner_step.py compares the two)."""


UPDATE_MACS_FOR_ALL_CORES = 2048 * 64 * 64
"""Updates whose widest matrix product (rows x width in x width out of one hidden layer, all
vmapped rows together) has at least this many multiply-adds run on every core: PPO CartPole's
2048-row minibatches through its 64x64 layer."""


def _widest_layer(hidden) -> int:
    """in x out of the widest hidden-to-hidden layer of an MLP with hidden sizes `hidden` (h x h for one)."""
    widths = tuple(hidden or ())
    if len(widths) < 2:
        return widths[0] ** 2 if widths else 0
    return max(a * b for a, b in zip(widths, widths[1:]))


def update_threads_for(config, off_policy: bool, width: int, threads: int | None,
                       images: bool = False) -> int | None:
    """The torch intra-op threads of the update when `--update-threads` is not given.

    The envs are idle while the serial loop updates, so the update's matrix products can have
    every core. That pays from about 2048 x 64 x 64 multiply-adds per layer
    (`UPDATE_MACS_FOR_ALL_CORES`: rows = an on-policy minibatch or an off-policy batch, times
    the vmapped rows, times `_widest_layer(config.hidden)`), or at any size with image
    observations (conv torso). Interleaved on 2 cores (`benchmarks/probes/threads.md`), 1 vs 2
    threads: PPO CartPole's 2048-row minibatches 1.22-1.4x faster on 2, 1024 rows 0.89-1.17x,
    128 rows (CleanRL's 4 envs) 0.88-0.91x and fnrl's default 256 rows 0.84x; PPO Pong's
    Nature CNN 1.4x; replay sample + update (two runs) of SAC / TD3 HalfCheetah (batch 256,
    256x256) 1.43-1.48x / 1.43-1.45x, DQN CartPole's default (batch 128, 256x256) 1.29-1.32x,
    DQN Pong (batch 32, Nature CNN) 1.35-1.75x, while CleanRL's DQN CartPole (batch 128,
    120x84) 0.98-1.05x and SAC Pendulum's default (batch 256, 64x64) 0.85-0.94x stay on
    `threads`. None keeps torch's own default."""
    if threads is None:
        return threads
    if off_policy:
        rows = config.batch_size * width
    else:
        rows = config.num_envs * config.num_steps // getattr(config, "num_minibatches", 1) * width
    macs = rows * _widest_layer(getattr(config, "hidden", ()))
    return len(os.sched_getaffinity(0)) if images or macs >= UPDATE_MACS_FOR_ALL_CORES else threads


@contextlib.contextmanager
def _intra_op_threads(n: int | None):
    """torch's intra-op threads set to `n` for a while (a no-op for None or the current count)."""
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _finite_metrics(metrics) -> dict:
    return {k: float(v) for k, v in metrics.items() if torch.is_tensor(v) and v.ndim == 0}


def _raise_if_loss_not_finite(bad: dict, env_steps: int, last_checkpoint) -> None:
    """TrainingError naming the first non-finite loss (`bad`: name -> value), if any."""
    if bad:
        raise TrainingError(f"{', '.join(bad)} became {list(bad.values())[0]} by env step {env_steps}; "
                            f"the last good checkpoint is {last_checkpoint}")


def _check_finite(metrics, env_steps: int, last_checkpoint) -> dict:
    """The 0-d metrics as floats; TrainingError if a loss among them is NaN or infinite."""
    scalars = _finite_metrics(metrics)
    _raise_if_loss_not_finite({k: v for k, v in scalars.items() if k.startswith("loss") and not math.isfinite(v)},
                              env_steps, last_checkpoint)
    return scalars


@contextlib.contextmanager
def _environ(name: str, value: str):
    """Set environment variable `name` (seen by this process and the ones it starts) for a while."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def train(name: str, config=None, *, nproc: int | None = None, env_threads: int | None = None,
          **kwargs) -> TrainResult:
    """Train algorithm `name` with `config` (default: the algorithm's defaults).

    nproc: run N data-parallel processes on this machine (fnrl.distributed; gradients averaged
        over the ranks) and return rank 0's result. Under `torchrun` (WORLD_SIZE > 1) every
        process calling `train` is one rank of the run. Distributed runs: `config.total_steps`
        is the whole run's budget (each rank steps total_steps / N); every other field is per
        rank (num_envs, batch_size, buffer_size, learning_starts).
    env_threads: EnvPool threads of every env of the run, in every process (default:
        `fnrl.envs.envpool_threads`: 1 for classic-control tasks, one per core otherwise).
    Other keywords: see `_train`.
    """
    if env_threads is not None:
        if env_threads < 0:
            raise ConfigError(f"--env-threads must be >= 0 (0: one per core), got {env_threads}")
        with _environ(envs.ENV_THREADS_VAR, str(env_threads)):
            return train(name, config, nproc=nproc, **kwargs)
    if nproc is not None and nproc != 1:
        from fnrl.distributed.launch import train_processes

        return train_processes(nproc, name, config, **kwargs)
    from fnrl.distributed import world_from_env

    world = world_from_env(kwargs.get("device", "cpu"))
    try:
        return _train(world, name, config, **kwargs)
    finally:
        world.close()


def _train(world, name: str, config=None, *, seed: int = 0, log_dir=None, device: str = "cpu", compile: bool = True,
           quiet: bool = False, resume=None, log_interval: int | None = None, checkpoint_every: int | None = None,
           threads: int | None = 1, update_threads: int | None = None, tensorboard: bool = True,
           plot: bool = True, stop_return: float | None = None, eval_interval: int | None = None,
           eval_episodes: int = 10, sampler: str | None = None, sampler_workers: int | None = None, num_seeds: int = 1,
           sweep: dict | None = None, cuda_graphs: bool = False, preset: str | None = None) -> TrainResult:
    """One process (of `world`, a fnrl.distributed World) of `train`.

    log_interval: env steps between log rows (default: about 100 rows per run).
    checkpoint_every: env steps between checkpoints (default: 10 per run, and the end).
    threads: torch intra-op threads (1 suits small networks on a few cores; None keeps
        torch's default).
    update_threads: torch intra-op threads while the serial loop updates (default: see
        `update_threads_for`: every core for updates of at least 2048 x 64 x 64 multiply-adds
        per layer or of images, else `threads`).
    resume: a run folder; training continues from its checkpoint with its config (and, where the
        checkpoint holds them, its replay buffer and the graph sampler's envs; see `checkpoint`).
    stop_return: stop early (with a checkpoint) at the first log row where the trailing mean
        return (last 100 finished episodes, `fnrl.episodes`) is at least this value after at
        least 20 finished episodes; with several rows (seeds, swept values), where every row's is.
    num_seeds, sweep: train num_seeds seeds (seed, seed + 1, ...) and, with sweep={FIELD: [v1, ...]},
        each value of one numeric Config field, all at once in one process (fnrl.seeds): one env
        pool, the states stacked, acting and the update vmapped. progress.csv then has one row
        per seed (and value) per log interval, with a `seed` column (and a FIELD column); env
        steps and total_steps count per seed, `sps` counts all seeds together.
    eval_episodes: the final evaluation: at the end of the run, the policy of every row acts
        without exploration (greedy / the distribution's mode) for this many full episodes on
        separate eval envs (`fnrl.evaluate.RunEvaluation`), logged in the last row as
        `eval_return_mean` and `eval_return_std` (NaN in the other rows) and returned as
        `TrainResult.eval_returns`; 0 turns evaluation off.
    eval_interval: also evaluate at the first log row after every `eval_interval` env steps.
    sampler: how rollouts are collected: a name of fnrl.samplers (serial, alternating,
        parallel, graph: the env's dynamics in torch, compiled with the policy into one call per
        rollout, for the envs of fnrl.envs.functional: CartPole, Acrobot, Pendulum, MountainCar),
        or "async" (off-policy: sampling in its own process, see fnrl.train_async). Default: serial;
        a resumed run's, the one its checkpoint was written with.
    sampler_workers: worker processes of the parallel sampler (default: one per core).
    cuda_graphs: replay steps from CUDA graphs (`fnrl.cudagraphs`; needs --device cuda and
        compile): off-policy, the fused learner step (one seed, a row replay without frame
        stacks); on-policy (PPO, A2C), the update and a feed-forward policy's acting step (one
        seed, one process, the serial sampler).
    """
    module = algos.load(name)
    if resume is not None:
        with world.agree():
            ckpt = load_checkpoint(resume) if world.main else None
        ckpt = world.broadcast_object(ckpt)
        if ckpt.get("world_size", 1) != world.size:
            raise ConfigError(f"checkpoint {resume} was written by {ckpt.get('world_size', 1)} processes; resume it "
                              f"with --nproc {ckpt.get('world_size', 1)}, not {world.size}")
        if ckpt["algo"] != name:
            raise ConfigError(f"checkpoint {resume} is from {ckpt['algo']}, not {name}; "
                              f"run `fnrl train {ckpt['algo']} --resume {resume}`")
        config = type(algos.default_config(name))(**_from_json(ckpt["config"]))
        log_dir, seed = resume, ckpt["seed"]
        num_seeds, sweep = ckpt.get("num_seeds", 1), ckpt.get("sweep")
        sampler = sampler or ckpt.get("sampler", "serial")
        preset = ckpt.get("preset")
    sampler = sampler_name = sampler or "serial"
    if config is None:
        from fnrl.presets import configure

        config, preset = configure(name)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    module.validate(config)
    from fnrl.cudagraphs import check_cuda_graphs

    off_policy = module.KIND == "off_policy"
    check_cuda_graphs(cuda_graphs, device=device, compile=compile, algo=name, off_policy=off_policy, sampler=sampler,
                      central=getattr(module, "RUNTIME", "serial") == "central",
                      single=None if num_seeds == 1 and not sweep else False)
    rows = None
    if num_seeds != 1 or sweep:
        from fnrl import seeds as vmapped

        rows = vmapped.make_rows(module, config, seed, num_seeds, sweep)
        sweep = {vmapped.ALIASES.get(k, k): [float(v) for v in vs] for k, vs in sweep.items()} if sweep else None
    width = len(rows) if rows else 1  # independent rows trained side by side
    if rows and sampler not in ("serial", "graph"):
        raise ConfigError("--num-seeds / --sweep train with the serial sampler (or the graph sampler); drop "
                          "--sampler, or run the seeds separately")
    if not isinstance(eval_episodes, int) or eval_episodes < 0:
        raise ConfigError(f"--eval-episodes must be >= 0 (0 turns the final evaluation off), got {eval_episodes!r}")
    if eval_interval is not None and (not isinstance(eval_interval, int) or eval_interval < 1 or not eval_episodes):
        raise ConfigError(f"--eval-interval must be a positive number of env steps, with --eval-episodes >= 1; got "
                          f"{eval_interval!r} and {eval_episodes!r}")
    if world.size > 1 and (rows or sampler != "serial"):
        raise ConfigError("data-parallel runs (--nproc / torchrun) use the serial sampler and one seed per "
                          "process; drop --sampler / --num-seeds / --sweep")
    device = world.device(device)
    run_config = config   # as asked: saved in config.json and checkpoints; a rank runs its share of total_steps
    if world.size > 1:
        config = dataclasses.replace(config, total_steps=-(-config.total_steps // world.size))
    if sampler != "async":
        samplers.load(sampler)   # an unknown name: one line listing the choices
    if sampler == "graph":
        from fnrl.samplers.graph import check_supported

        check_supported(name, module)
    if threads is not None:
        torch.set_num_threads(threads)
    if update_threads is not None and update_threads < 1:
        raise ConfigError(f"--update-threads must be at least 1, got {update_threads}")
    rng.seed_everything(seed, world.rank)
    runtime = "async" if sampler == "async" else getattr(module, "RUNTIME", "serial")
    if update_threads is not None and runtime != "serial":
        raise ConfigError(f"--update-threads applies to the serial training loop, not to {name}'s {runtime} one; "
                          "drop it (--threads sets the learner's threads there)")
    if sampler == "async":
        from fnrl.train_async import train_async

        return train_async(name, module, config, seed=seed, log_dir=log_dir, device=device, compile=compile,
                           quiet=quiet, ckpt=ckpt if resume is not None else None, log_interval=log_interval,
                           checkpoint_every=checkpoint_every, threads=threads, tensorboard=tensorboard, plot=plot,
                           stop_return=stop_return, eval_episodes=eval_episodes, eval_interval=eval_interval,
                           preset=preset)
    if getattr(module, "RUNTIME", "serial") == "central":  # actor processes + central inference (IMPALA)
        from fnrl.train_central import train_central

        if rows or world.size > 1 or sampler != "serial":
            raise ConfigError(f"{name} runs its own actor processes: drop --sampler, --nproc, --num-seeds and "
                              "--sweep (run its seeds as separate runs)")
        return train_central(name, module, config, seed=seed, log_dir=log_dir, device=device, compile=compile,
                             quiet=quiet, resume=resume, log_interval=log_interval,
                             checkpoint_every=checkpoint_every, tensorboard=tensorboard, plot=plot,
                             stop_return=stop_return, eval_episodes=eval_episodes, eval_interval=eval_interval,
                             preset=preset)
    sequence_replay = getattr(module, "REPLAY", None) == "sequence"
    if sampler == "graph":   # the env's dynamics in torch, compiled into the rollout (fnrl.samplers.graph)
        from fnrl.envs import functional

        env = functional.make(config.env_id, width * config.num_envs, seed=rng.derive(seed, rng.ENV))
        if rows:
            agent = vmapped.make_agent(module, rows, env.spec, config.num_envs, compile)
    elif rows:
        env = vmapped.make_env(config.env_id, rows, config.num_envs)
        agent = vmapped.make_agent(module, rows, env.spec, config.num_envs, compile)
    else:   # each env of each rank its own seed (fnrl.rng)
        env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs, world.rank))
    # one compiled graph samples and updates (fnrl.learner): row replay without frame dedup, one seed
    fused_learner = (FUSED_LEARNER and compile and off_policy and not rows and not sequence_replay
                     and not env.spec.is_atari)
    check_cuda_graphs(cuda_graphs, device=device, compile=compile, algo=name, off_policy=off_policy,
                      fused_learner=fused_learner and world.size == 1, single=not rows and world.size == 1)
    if not rows:
        agent = _make_agent(module, config, env.spec, compile, update_compiled_by_learner=fused_learner)
    if cuda_graphs and not off_policy:   # the update and the acting step, each replayed from a CUDA graph
        from fnrl.cudagraphs import graphed_on_policy

        agent = graphed_on_policy(agent, getattr(module, "ACT_KEYS", None), getattr(config, "core", "none") != "none")
    with world.agree():
        run_dir = _prepare_log_dir(log_dir, name, config, seed, resume is not None) if world.main else None
    if world.main:
        write_config_json(run_dir, name, seed, run_config, preset, **({"num_seeds": num_seeds, "sweep": sweep}
                                                                       if rows else {}))

    state = agent.init(seed)
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    replay_state = None
    update_credit = 0.0
    if resume is not None:
        state = _restored(state, ckpt["state"], resume)
        counters = ckpt["counters"]
        if off_policy:   # the experience the run had, where the checkpoint could hold it
            replay_state, update_credit = _resumed_replay(ckpt, resume, device)
        if world.main:   # the checkpoint holds rank 0's RNG; other ranks reseed from where the run stands
            torch.set_rng_state(ckpt["torch_rng"])
            np.random.set_state(ckpt["numpy_rng"])
        else:
            rng.seed_everything(seed, world.rank, counters["env_steps"])
    state = world.broadcast_state(state.to(device))   # identical parameters on every rank
    stats = EpisodeStats(width)
    if resume is not None and ckpt.get("episodes") is not None:
        stats.load_state_dict(ckpt["episodes"])
    evaluation = None
    if eval_episodes and eval_interval is None and not envs.known(config.env_id):
        warnings.warn(f"{config.env_id} has no EnvPool or gymnasium env to evaluate on; the run ends without its "
                      "final evaluation", stacklevel=3)
        eval_episodes = 0
    if eval_episodes and world.main:
        from fnrl.evaluate import RunEvaluation

        evaluation = RunEvaluation(name, [row.config for row in rows] if rows else [config],
                                   [row.seed for row in rows] if rows else [seed], eval_episodes,
                                   interval=eval_interval, start=counters["env_steps"], device=device)

    from fnrl.logger import Logger
    sampler = samplers.make(sampler, env, agent.act, config.num_steps, device=device, agent=(name, config),
                            workers=sampler_workers)
    # a sampler whose envs can be snapshot (the graph sampler's tensors, in-process gymnasium envs)
    # keeps them in the checkpoint: the run resumes mid-episode
    keeps_envs = world.size == 1 and hasattr(sampler, "state_dict")
    if resume is not None and keeps_envs and ckpt.get("sampler_state") is not None:
        sampler.load_state_dict(ckpt["sampler_state"])
    logger = Logger(run_dir, tensorboard=tensorboard, append=resume is not None) if world.main else RowsOnly()
    logger.group_keys = tuple(sweep or ())
    if update_threads is None:   # several ranks on one machine already share its cores
        images = isinstance(env.spec.obs_shape, tuple) and len(env.spec.obs_shape) == 3
        update_threads = (update_threads_for(config, off_policy, width, threads, images) if world.size == 1
                          else threads)
    if not (threads == update_threads == 1 and world.size == 1) and isinstance(env, envs.BatchedEnv):
        # a polling recv (fnrl.envs.batched.EnvPoolCalls) would be one busy thread too many: idle
        # OpenMP threads of a multi-thread act or update spin on into the collect (64-env PPO
        # collects up to 1.24x slower polling, `benchmarks/probes/env_wait.md`), and ranks share the cores
        env.poll = False
    steps_per_collect = config.num_steps * config.num_envs
    log_interval = log_interval or max(steps_per_collect, config.total_steps // 100)
    checkpoint_every = checkpoint_every or max(steps_per_collect, config.total_steps // 10)

    def checkpoint():
        """The run as it stands: state, counters, RNG and, in one process, what it can snapshot of its
        data: the sampler's envs where they are tensors, the replay up to its size limit."""
        if not world.main:
            return
        save_checkpoint(run_dir / CHECKPOINT, {
            "format": CHECKPOINT_FORMAT, "algo": name, "seed": seed, "config": dataclasses.asdict(run_config),
            "state": state.cpu(), "counters": dict(counters), "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(), "world_size": world.size,
            "sampler": sampler_name, "sampler_state": sampler.state_dict() if keeps_envs else None, "preset": preset,
            "episodes": stats.state_dict(),
            **({"replay": _checkpointed_replay(replay_state) if world.size == 1 else None,
                "update_credit": update_credit} if off_policy else {}),
            **({"num_seeds": num_seeds, "sweep": sweep} if rows else {}),
        })

    def check_finite() -> dict:
        scalars = world.mean(_finite_metrics(metrics))   # the same on every rank, so all stop together
        bad = {k: v for k, v in scalars.items() if k.startswith("loss") and not math.isfinite(v)}
        if rows:  # metrics [R]: one value per row
            bad.update({k: float(v[~torch.isfinite(v)][0]) for k, v in metrics.items()
                        if k.startswith("loss") and v.ndim == 1 and not torch.isfinite(v).all()})
        _raise_if_loss_not_finite(bad, counters["env_steps"] * world.size,
                                  run_dir / CHECKPOINT if world.main else "on rank 0")
        return scalars

    bar = None
    if not quiet and world.main:
        from tqdm import tqdm

        bar = tqdm(total=config.total_steps * world.size, initial=counters["env_steps"] * world.size, unit="step",
                   dynamic_ncols=True, desc=f"{name} {config.env_id}")
    finished = [[] for _ in range(width)]   # returns of the episodes each row finished since the last log row
    next_log = counters["env_steps"] + log_interval
    next_ckpt = counters["env_steps"] + checkpoint_every
    metrics = {}
    solved = False
    t_start = time.perf_counter() - counters["wall_s"]
    t_log, steps_log = time.perf_counter(), counters["env_steps"]
    warm, updates_here = False, 0   # warm: compiled, after two updates in this process
    # guard skipping is checked for on-policy updates (vmapped rows too) and the row replay (DQN family,
    # DDPG/TD3/SAC), not yet for sequence replay (R2D1) or several rows' replays
    may_skip_guards = compile and SKIP_GUARDS and not (rows and off_policy) and not sequence_replay
    learn = None   # the off-policy learner step (fnrl.learner), made with the replay buffer
    steady = _HeldStance()   # the compiled calls' stance, held from one iteration to the next
    try:
        while counters["env_steps"] < config.total_steps:
            steady.hold(warm)
            rollout = sampler.collect(state)
            counters["env_steps"] += steps_per_collect
            state["env_steps"].add_(steps_per_collect)   # in place, as `+=` is, without the TensorDict's set
            for r, returns in enumerate(returns_by_row(rollout, width)):
                finished[r].extend(returns)
            if not off_policy:
                with _intra_op_threads(update_threads):
                    state, metrics = agent.update(state, rollout)
                counters["updates"] += 1
                updates_here += 1
                warm = may_skip_guards and updates_here >= 2
            else:
                if sequence_replay:
                    from fnrl.replay import sequence as replay

                    data, priority = (vmapped.sequence_input(module, rows, rollout) if rows
                                      else module.sequence_input(config, rollout))
                    if replay_state is None:
                        replay_state = _init_sequence_replay(config, data, env.spec, device, rows)
                    if rows:  # one sequence buffer per row, sampled as [R, L, N] (fnrl.replay.multi)
                        from fnrl.replay import multi as replay
                    replay_state = replay.add(replay_state, data, priority)
                else:
                    from fnrl import replay

                    if rows:  # one buffer per row, sampled as [R, N] (fnrl.replay.multi)
                        from fnrl.replay import multi as replay
                    if replay_state is None:
                        replay_state = _init_replay(config, rollout, env.spec, device, rows)
                    replay_state = replay.add(replay_state, rollout, compiled=compile, ahead_of_time=aot.ENABLED)
                if learn is None:
                    learn = _make_learner(agent.update, config, replay, fused_learner, compile, rows,
                                          sequence_replay, ahead_of_time=aot.ENABLED and world.size == 1,
                                          cuda_graph=cuda_graphs)
                if counters["env_steps"] >= config.learning_starts:
                    update_credit += steps_per_collect * config.replay_ratio
                    progress = counters["env_steps"] / config.total_steps
                    beta = config.priority_beta + (1.0 - config.priority_beta) * progress
                    while update_credit >= 1.0 and replay.can_sample(replay_state, config.batch_size):
                        with _intra_op_threads(update_threads):
                            state, replay_state, metrics = learn(state, replay_state, beta)
                        updates_here += 1   # act, add, sample and update have run, on fresh and updated states
                        warm = may_skip_guards and updates_here >= 2
                        update_credit -= 1.0
                        counters["updates"] += 1
            if bar is not None:
                bar.update(steps_per_collect * world.size)
            if counters["env_steps"] >= next_log or counters["env_steps"] >= config.total_steps:
                steady.release()
                next_log += log_interval
                now = time.perf_counter()
                scalars = check_finite()
                stats.add([world.gather(returns) for returns in finished])   # every rank's episodes
                finished = [[] for _ in range(width)]
                solved = stats.reached(stop_return)
                counters["episodes"] = sum(stats.finished)
                counters["wall_s"] = now - t_start
                sps = (counters["env_steps"] - steps_log) * world.size * width / max(now - t_log, 1e-9)
                shared = {"env_steps": counters["env_steps"] * world.size, "updates": counters["updates"],
                          "wall_s": round(counters["wall_s"], 3), "sps": round(sps, 1)}
                final = solved or counters["env_steps"] >= config.total_steps
                evaluations = evaluation(state, counters["env_steps"], final) if evaluation is not None else None
                metric_rows = (vmapped.metric_rows(metrics, width) if rows
                               else [{k: v for k, v in scalars.items() if k != "priority"}])
                for row in interval_rows(shared, stats.columns(), evaluations, metric_rows,
                                         [run.labels for run in rows] if rows else [{}]):
                    logger.log(row)
                t_log, steps_log = now, counters["env_steps"]
                if bar is not None:
                    bar.set_postfix(sps=f"{sps:.0f}", ret=f"{np.nanmean(stats.means()):.1f}")
            if solved or counters["env_steps"] >= next_ckpt or counters["env_steps"] >= config.total_steps:
                steady.release()
                next_ckpt += checkpoint_every
                check_finite()
                checkpoint()
            if solved:
                break
    finally:
        steady.release()
        if bar is not None:
            bar.close()
        logger.close()
        sampler.close()
        if evaluation is not None:
            evaluation.close()
    if plot and world.main:
        seeds_text = f"seeds {seed}-{seed + num_seeds - 1}" if num_seeds > 1 else f"seed {seed}"
        logger.plot(title=f"{name} {config.env_id} {seeds_text}" + (f", sweep {', '.join(sweep)}" if sweep else ""))
    return TrainResult(state=state, return_mean=_mean_of_rows(stats.means()), history=logger.rows, log_dir=run_dir,
                       eval_returns=evaluation.returns if evaluation is not None else None)


def _mean_of_rows(values: list[float]) -> float:
    """The mean of the rows' values that are defined (NaN if none is)."""
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else math.nan


def _restored(fresh, saved, resume):
    """A new run's `init` state `fresh` holding the checkpoint's values `saved` (copied in): the
    resumed run then traces its ahead-of-time models from a state of a new run's key order and
    layout, and finds them in the package cache (an update returns its state in another order);
    ConfigError if the two states do not have the same entries."""
    keys = list(fresh.keys(include_nested=True, leaves_only=True))
    if (set(keys) != set(saved.keys(include_nested=True, leaves_only=True))
            or any(fresh.get(k).shape != saved.get(k).shape or fresh.get(k).dtype != saved.get(k).dtype for k in keys)):
        raise ConfigError(f"the state in checkpoint {resume} does not fit this fnrl version's state of the "
                          "algorithm; resume it with the version that wrote it, or retrain")
    for key in keys:
        fresh.get(key).copy_(saved.get(key))
    return fresh


def _checkpointed_replay(buffer):
    """What a checkpoint holds of the replay: the buffer, if it has one of at most
    `fnrl.replay.snapshot.CHECKPOINT_BYTES`, else None."""
    if buffer is None or replay_snapshot.nbytes(buffer) > replay_snapshot.CHECKPOINT_BYTES:
        return None
    return buffer


def _resumed_replay(ckpt: dict, resume, device) -> tuple:
    """(the checkpoint's replay buffer on `device`, or None with a warning that it starts empty; the
    loop's update credit)."""
    saved = ckpt.get("replay")
    if saved is None:
        warnings.warn(f"checkpoint {resume} holds no replay buffer (one over "
                      f"{replay_snapshot.CHECKPOINT_BYTES >> 30} GiB, or from a data-parallel run); "
                      "the resumed run's replay starts empty", stacklevel=3)
        return None, 0.0
    return replay_snapshot.to_device(saved, device), ckpt.get("update_credit", 0.0)


def _make_learner(update, config, replay, fused: bool, compile: bool, rows, sequence_replay: bool,
                  ahead_of_time: bool = False, cuda_graph: bool = False):
    """The loop's `learn(state, buffer, beta) -> (state, buffer, metrics)` (fnrl.learner): fused (sample and
    update in one graph, the state donated; as an AOTInductor model with `ahead_of_time`, which the loop
    asks for where `fnrl.aot.ENABLED` and one process trains: no all-reduce inside the step) or
    sample, update and priorities one by one (the row replay's draw compiled as its own graph under
    `compile`)."""
    from fnrl.learner import make_learner

    return make_learner(update, config.batch_size, config.prioritized, fused=fused,
                        ahead_of_time=fused and ahead_of_time, replay=replay,
                        sample_options={} if sequence_replay else {"compiled": compile}, rows=bool(rows),
                        cuda_graph=cuda_graph)


def _init_replay(config, rollout, spec, device, rows=None):
    """The replay buffer; for the rows of a vmapped run, one buffer per row with the row's gamma."""
    from fnrl import replay

    options = dict(n_step=config.n_step, prioritized=config.prioritized, alpha=config.priority_alpha,
                   frame_dedup=spec.is_atari, device=device)
    if rows:
        from fnrl.replay import multi

        return multi.init(rollout, config.buffer_size, num_rows=len(rows), gamma=[row.config.gamma for row in rows],
                          **options)
    return replay.init(rollout, config.buffer_size, gamma=config.gamma, **options)


def _init_sequence_replay(config, rollout, spec, device, seed_rows=None):
    """Sequence replay for algorithms that declare `REPLAY = "sequence"` (R2D1): sequences of
    burn_in + seq_len + n_step rows starting every carry_interval rows; for the rows of a
    vmapped run, one such buffer per row (fnrl.replay.multi.init_sequence)."""
    from fnrl.replay import multi, sequence

    rows = config.buffer_size // config.num_envs // config.carry_interval * config.carry_interval
    options = dict(burn_in=config.burn_in, seq_len=config.seq_len, n_step=config.n_step,
                   carry_interval=config.carry_interval, prioritized=config.prioritized,
                   alpha=config.priority_alpha, frame_dedup=spec.is_atari, device=device)
    if seed_rows:
        return multi.init_sequence(rollout, rows * config.num_envs, num_rows=len(seed_rows), **options)
    return sequence.init(rollout, rows * config.num_envs, **options)


def _from_json(d: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
