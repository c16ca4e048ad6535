"""The asynchronous training loop (`train(..., sampler="async")`, `fnrl train ALGO --sampler async`).

Off-policy algorithms only (the DQN family, ddpg / td3 / sac). A sampler process
(`fnrl.samplers.async_.AsyncSampler`) steps EnvPool with a CPU copy of the acting
parameters and writes [T, B] rollouts into a shared-memory replay
(`fnrl.replay.shared.SharedReplay`); this (main) process samples that replay under
its lock, runs the compiled `update` on `device`, writes priorities back, publishes the
parameters with a version number every few updates, logs and checkpoints.

Replay ratio: update u + 1 runs only when u < due(E) (`Throttle`: the serial loop's
count after E env steps), so the updates per env step match `--sampler serial`; the
sampler stays at most `max_lead_collects` collects ahead of the updates it has made
due. progress.csv gets, beside the serial columns, `policy_lag` (updates made since
the parameters the sampler last acted with were published), `opt_wait` and
`sampler_wait` (fraction of the interval each process spent waiting for the other).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from fnrl import algos, envs, rng
from fnrl.episodes import EpisodeStats
from fnrl.errors import ConfigError
from fnrl.logger import interval_rows
from fnrl.replay import snapshot as replay_snapshot
from fnrl.replay.shared import SharedReplay
from fnrl.samplers.async_ import POLL_S, AsyncSampler, SamplerError, SharedParams, Throttle, TimedLock, start_method
from fnrl.samplers.serial import SerialSampler
from fnrl.train import (CHECKPOINT, CHECKPOINT_FORMAT, TrainingError, TrainResult, _check_finite,
                        _init_replay, _make_agent, _prepare_log_dir, _resumed_replay,
                        save_checkpoint, write_config_json)

ACT_KEYS = ("params", "obs_rms")
"""State keys an off-policy `act` may read besides env_steps (a module may set its own `ACT_KEYS`)."""

PUBLISH_EVERY = 4
"""Updates between two parameter publications (also published whenever the optimizer waits)."""


def check_async(name: str, module, config, sampler_device: str = "cpu", max_lead_collects: int | None = 4) -> None:
    """Raise ConfigError (one line) for settings the async sampler cannot run."""
    if module.KIND != "off_policy":
        raise ConfigError(f"--sampler async runs off-policy algorithms (dqn family, ddpg, td3, sac); {name} is "
                          f"on-policy: use --sampler serial")
    if getattr(module, "REPLAY", None) == "sequence":
        raise ConfigError(f"--sampler async does not support sequence replay ({name}) yet; use --sampler serial")
    if torch.device(sampler_device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"sampler_device={sampler_device} asked for CUDA but none is available; use 'cpu'")
    if max_lead_collects is not None and max_lead_collects < 1:
        raise ConfigError(f"max_lead_collects must be >= 1 (or None for no sampler throttle), got {max_lead_collects}")


def _build_actor(name: str, config, seed: int):
    """Run in the sampler process: its own env (each env seeded from the run's seed, `fnrl.rng`),
    the policy's act and an initial state."""
    module = algos.load(name)
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    env.poll = False   # the sampler shares the cores with the learner: EnvPool's recv sleeps at once
    agent = module.make(config, env.spec)
    return env, agent.act, agent.init(seed)


def train_async(name: str, module, config, *, seed: int, log_dir, device: str = "cpu", compile: bool = True,
                quiet: bool = False, ckpt: dict | None = None, log_interval: int | None = None,
                checkpoint_every: int | None = None, threads: int | None = 1, tensorboard: bool = True,
                plot: bool = True, stop_return: float | None = None, eval_episodes: int = 10,
                eval_interval: int | None = None, sampler_device: str = "cpu", max_lead_collects: int | None = 4,
                stall_timeout: float = 300.0, preset: str | None = None) -> TrainResult:
    """Train off-policy algorithm `name` with the async sampler; arguments as `fnrl.train.train`.

    device: where the optimizer (update) runs, e.g. "cuda"; sampler_device: where the
      sampler's acting copy runs ("cpu" by default, or a second GPU such as "cuda:1").
    max_lead_collects: the sampler waits while the optimizer owes more than this many
      collects (num_steps x num_envs env steps) of updates; None lets it run free.
    stall_timeout: seconds a live sampler may go without progress before the run fails.
    ckpt: a checkpoint dict to resume from (train() loads it).
    Raises TrainingError (one line) if the sampler process fails, dies or stalls, or a
    loss becomes NaN; the last checkpoint stays intact.
    """
    check_async(name, module, config, sampler_device, max_lead_collects)
    steps_per_collect = config.num_steps * config.num_envs
    probe = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    spec = probe.spec
    agent = _make_agent(module, config, spec, compile)
    state = agent.init(seed)
    try:
        example = SerialSampler(probe, agent.act, 1).collect(state).clone()   # [1, B]: the replay's row layout
    finally:
        probe.close()
    run_dir = _prepare_log_dir(log_dir, name, config, seed, ckpt is not None)
    write_config_json(run_dir, name, seed, config, preset, sampler="async", device=str(device),
                      sampler_device=str(sampler_device))
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    stats = EpisodeStats()
    if ckpt is not None:
        state, counters = ckpt["state"], dict(ckpt["counters"])
        torch.set_rng_state(ckpt["torch_rng"])
        np.random.set_state(ckpt["numpy_rng"])
        if ckpt.get("episodes") is not None:
            stats.load_state_dict(ckpt["episodes"])
    state = state.to(device)

    ctx_method = start_method(sampler_device)
    ctx = torch.multiprocessing.get_context(ctx_method)
    saved = _resumed_replay(ckpt, log_dir, "cpu")[0] if ckpt is not None else None   # the rows it had
    replay = SharedReplay(saved if saved is not None else _init_replay(config, example, spec, "cpu"),
                          TimedLock(ctx.RLock()))
    act_keys = [k for k in getattr(module, "ACT_KEYS", ACT_KEYS) if k != "env_steps" and k in state.keys(True)]
    params = SharedParams(state.select(*act_keys), TimedLock(ctx.Lock()))
    params.publish(state.select(*act_keys), counters["updates"])
    throttle = Throttle(steps_per_collect, config.learning_starts, config.replay_ratio,
                        None if max_lead_collects is None else max_lead_collects * steps_per_collect)
    sampler = AsyncSampler(_build_actor, (name, config, seed), replay, params, throttle, horizon=config.num_steps,
                           total_steps=config.total_steps, start_env_steps=counters["env_steps"], device=sampler_device, seed=seed, threads=threads,
                           stall_timeout=stall_timeout, method=ctx_method)

    def checkpoint():
        save_checkpoint(run_dir / CHECKPOINT, {
            "format": CHECKPOINT_FORMAT, "algo": name, "seed": seed, "config": dataclasses.asdict(config),
            "state": state.cpu(), "counters": dict(counters), "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(), "sampler": "async", "episodes": stats.state_dict(), "preset": preset,
            "replay": replay.snapshot() if replay.nbytes <= replay_snapshot.CHECKPOINT_BYTES else None,
        })

    def check_finite() -> dict:
        return _check_finite(metrics, counters["env_steps"], run_dir / CHECKPOINT)

    from fnrl.logger import Logger

    sampler.start()   # before the logger's and progress bar's threads exist (the sampler may be forked)
    logger = bar = evaluation = None
    try:
        if eval_episodes:
            from fnrl.evaluate import RunEvaluation

            evaluation = RunEvaluation(name, [config], [seed], eval_episodes, interval=eval_interval,
                                       start=counters["env_steps"], device=device)
        logger = Logger(run_dir, tensorboard=tensorboard, append=ckpt is not None)
        log_interval = log_interval or max(steps_per_collect, config.total_steps // 100)
        checkpoint_every = checkpoint_every or max(steps_per_collect, config.total_steps // 10)
        if not quiet:
            from tqdm import tqdm

            bar = tqdm(total=config.total_steps, initial=counters["env_steps"], unit="step", dynamic_ncols=True,
                       desc=f"{name} {config.env_id} async")
        next_log = counters["env_steps"] + log_interval
        next_ckpt = counters["env_steps"] + checkpoint_every
        metrics, solved = {}, False
        env_steps, updates, published = counters["env_steps"], counters["updates"], counters["updates"]
        t_start = time.perf_counter() - counters["wall_s"]
        t_log, steps_log, idle = time.perf_counter(), env_steps, 0.0
        seen = sampler.read()
        while True:
            sampler.check()
            snap = sampler.read()
            if bar is not None:
                bar.update(snap["env_steps"] - env_steps)
            env_steps = snap["env_steps"]
            state["env_steps"].fill_(env_steps)
            due, done = throttle.due(env_steps), 0
            starved = False
            while updates < due and done < PUBLISH_EVERY:
                beta = config.priority_beta + (1.0 - config.priority_beta) * env_steps / config.total_steps
                batch = replay.sample(config.batch_size, beta=beta)
                if batch is None:
                    starved = True
                    break
                state, metrics = agent.update(state, batch.to(device, non_blocking=True))
                if config.prioritized:
                    replay.update_priorities(batch["index"], metrics["priority"])
                updates += 1
                done += 1
            if updates != published and (done == 0 or done == PUBLISH_EVERY or updates >= due):
                params.publish(state.select(*act_keys), updates)
                published = updates
            sampler.notify(updates, can_sample=not starved)
            counters["env_steps"], counters["updates"] = env_steps, updates
            finished = snap["done"] and (updates >= due or starved)
            # a row is written once the updates the serial loop makes by the log boundary are done
            caught_up = updates >= throttle.due(next_log) or starved
            if (env_steps >= next_log and caught_up and env_steps < config.total_steps) or finished:
                while next_log <= env_steps:
                    next_log += log_interval
                now = time.perf_counter()
                scalars = check_finite()
                stats.add([sampler.returns_since(seen["episodes"])])
                solved = stats.reached(stop_return)
                counters["episodes"] += snap["episodes"] - seen["episodes"]
                counters["wall_s"] = now - t_start
                span = max(now - t_log, 1e-9)
                shared = {"env_steps": env_steps, "updates": updates, "wall_s": round(counters["wall_s"], 3),
                          "sps": round((env_steps - steps_log) / span, 1), "policy_lag": updates - snap["version"],
                          "opt_wait": round(min(idle / span, 1.0), 3),
                          "sampler_wait": round(min((snap["wait_s"] - seen["wait_s"]) / span, 1.0), 3)}
                evaluations = (evaluation(state, env_steps, final=solved or finished)
                               if evaluation is not None else None)
                for row in interval_rows(shared, stats.columns(), evaluations,
                                         [{k: v for k, v in scalars.items() if k != "priority"}], [{}]):
                    logger.log(row)
                seen, t_log, steps_log, idle = snap, now, env_steps, 0.0
                if bar is not None:
                    bar.set_postfix(sps=f"{shared['sps']:.0f}", ret=f"{stats.means()[0]:.1f}",
                                    lag=shared["policy_lag"])
            if solved or finished or env_steps >= next_ckpt:
                while next_ckpt <= env_steps:
                    next_ckpt += checkpoint_every
                check_finite()
                checkpoint()
            if solved or finished:
                break
            if done == 0:
                t = time.perf_counter()
                sampler.wait_for_data(POLL_S)
                idle += time.perf_counter() - t
    except (SamplerError, TimeoutError) as e:
        raise TrainingError(f"{e}; the last checkpoint is {run_dir / CHECKPOINT}") from None
    finally:
        sampler.stop()
        if bar is not None:
            bar.close()
        if logger is not None:
            logger.close()
        if evaluation is not None:
            evaluation.close()
    if plot:
        logger.plot(title=f"{name} {config.env_id} seed {seed} (async)")
    return TrainResult(state=state, return_mean=stats.means()[0], history=logger.rows, log_dir=run_dir,
                       eval_returns=evaluation.returns if evaluation is not None else None)
