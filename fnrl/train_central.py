"""The learner loop of algorithms with central inference (`RUNTIME = "central"`, IMPALA).

`fnrl.train.train` hands such algorithms here. Actor processes step the envs and a
central inference server in this process acts for them (fnrl.samplers.central); this
loop pops `batch_size` trajectories at a time, makes one update, serves the new
parameters (policy version + 1), and logs and checkpoints through the same helpers as
`train` (Logger, save_checkpoint, the run folder). Besides train's columns, progress.csv
holds `policy_lag_mean` (learner version minus the behaviour version of the consumed
steps, averaged over the interval), `policy_lag_max`, and `inference_batch` (mean
actor requests per inference forward).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from fnrl import envs
from fnrl.episodes import EpisodeStats, returns_by_row
from fnrl.logger import interval_rows
from fnrl.train import (CHECKPOINT, CHECKPOINT_FORMAT, TrainingError, TrainResult, _check_finite,
                        _prepare_log_dir, load_checkpoint, save_checkpoint, write_config_json)


def train_central(name: str, module, config, *, seed: int, log_dir, device: str, compile: bool, quiet: bool,
                  resume, log_interval: int | None, checkpoint_every: int | None, tensorboard: bool, plot: bool,
                  stop_return: float | None, eval_episodes: int = 10, eval_interval: int | None = None,
                  preset: str | None = None) -> TrainResult:
    """Train `module` (already validated, config resolved) with actor processes and central inference.

    Arguments as `fnrl.train.train`. Raises TrainingError (one line) if an actor dies,
    the inference server fails, or a loss becomes NaN; the last checkpoint stays intact.
    """
    from fnrl.logger import Logger
    from fnrl.samplers.central import ActorError, CentralSampler

    spec = envs.env_spec(config.env_id, config.num_envs)
    module.validate(config, spec)
    agent = module.make(config, spec)
    # the inference thread gets its own network modules: functional_call swaps a module's
    # parameters while it runs, so one module must not serve two threads at once
    inference_act = module.make(config, spec).act
    update = torch.compile(agent.update, fullgraph=True, dynamic=False) if compile else agent.update
    run_dir = _prepare_log_dir(log_dir, name, config, seed, resume is not None)
    write_config_json(run_dir, name, seed, config, preset)

    state = agent.init(seed)
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    stats = EpisodeStats()
    if resume is not None:
        ckpt = load_checkpoint(resume)
        state, counters = ckpt["state"], ckpt["counters"]
        torch.set_rng_state(ckpt["torch_rng"])
        np.random.set_state(ckpt["numpy_rng"])
        if ckpt.get("episodes") is not None:
            stats.load_state_dict(ckpt["episodes"])
    state = state.to(device)
    version = counters["updates"]

    steps_per_update = config.num_steps * config.num_envs * config.batch_size
    log_interval = log_interval or max(steps_per_update, config.total_steps // 100)
    checkpoint_every = checkpoint_every or max(steps_per_update, config.total_steps // 10)

    def checkpoint():
        save_checkpoint(run_dir / CHECKPOINT, {
            "format": CHECKPOINT_FORMAT, "algo": name, "seed": seed, "config": dataclasses.asdict(config),
            "state": state.cpu(), "counters": dict(counters), "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(), "episodes": stats.state_dict(), "preset": preset,
        })

    sampler = CentralSampler(config.env_id, config.num_envs, config.num_actors, inference_act, state,
                             horizon=config.num_steps, obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype,
                             seed=seed, num_slots=config.queue_size, batch_wait_s=config.batch_wait_ms / 1000,
                             device=device)
    sampler.set_state(state, version)
    logger = Logger(run_dir, tensorboard=tensorboard, append=resume is not None)
    evaluation = bar = None
    if eval_episodes:
        from fnrl.evaluate import RunEvaluation

        evaluation = RunEvaluation(name, [config], [seed], eval_episodes, interval=eval_interval,
                                   start=counters["env_steps"], device=device)
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=config.total_steps, initial=counters["env_steps"], unit="step", dynamic_ncols=True,
                   desc=f"{name} {config.env_id}")
    finished: list[float] = []   # returns of the episodes finished since the last log row
    lags: list[torch.Tensor] = []
    next_log = counters["env_steps"] + log_interval
    next_ckpt = counters["env_steps"] + checkpoint_every
    metrics = {}
    t_start = time.perf_counter() - counters["wall_s"]
    forwards0 = requests0 = 0
    try:
        sampler.start()
        t_log, steps_log = time.perf_counter(), counters["env_steps"]
        while counters["env_steps"] < config.total_steps:
            try:
                batch = sampler.get(config.batch_size)
            except ActorError as e:
                kept = (f"the last checkpoint is {run_dir / CHECKPOINT}" if (run_dir / CHECKPOINT).exists()
                        else "no checkpoint was written yet")
                raise TrainingError(f"{e} (at env step {counters['env_steps']}); {kept}") from e
            counters["env_steps"] += steps_per_update
            state["env_steps"] += steps_per_update
            valid = batch["valid"]
            lags.append((version - batch["version"])[valid])
            finished.extend(returns_by_row(batch)[0])
            state, metrics = update(state, batch.exclude("version", "episode_end", "episode_return",
                                                         "episode_length"))
            version += 1
            counters["updates"] += 1
            sampler.set_state(state, version)
            if bar is not None:
                bar.update(steps_per_update)
            solved = False
            if counters["env_steps"] >= next_log or counters["env_steps"] >= config.total_steps:
                next_log += log_interval
                now = time.perf_counter()
                scalars = _check_finite(metrics, counters["env_steps"], run_dir / CHECKPOINT)
                stats.add([finished])
                solved = stats.reached(stop_return)
                counters["episodes"] += len(finished)
                counters["wall_s"] = now - t_start
                lag = torch.cat(lags).float()
                forwards, requests = sampler.forwards, sampler.requests
                shared = {"env_steps": counters["env_steps"], "updates": counters["updates"],
                          "wall_s": round(counters["wall_s"], 3),
                          "sps": round((counters["env_steps"] - steps_log) / max(now - t_log, 1e-9), 1),
                          "policy_lag_mean": float(lag.mean()) if lag.numel() else float("nan"),
                          "policy_lag_max": float(lag.max()) if lag.numel() else float("nan"),
                          "inference_batch": (requests - requests0) / max(forwards - forwards0, 1)}
                final = solved or counters["env_steps"] >= config.total_steps
                evaluations = evaluation(state, counters["env_steps"], final) if evaluation is not None else None
                for row in interval_rows(shared, stats.columns(), evaluations, [scalars], [{}]):
                    logger.log(row)
                finished, lags = [], []
                t_log, steps_log, forwards0, requests0 = now, counters["env_steps"], forwards, requests
                if bar is not None:
                    bar.set_postfix(sps=f"{shared['sps']:.0f}", ret=f"{stats.means()[0]:.1f}",
                                    lag=f"{shared['policy_lag_mean']:.1f}")
            if solved or counters["env_steps"] >= next_ckpt or counters["env_steps"] >= config.total_steps:
                next_ckpt += checkpoint_every
                _check_finite(metrics, counters["env_steps"], run_dir / CHECKPOINT)
                checkpoint()
            if solved:
                break
    finally:
        sampler.close()
        if bar is not None:
            bar.close()
        logger.close()
        if evaluation is not None:
            evaluation.close()
    if plot:
        logger.plot(title=f"{name} {config.env_id} seed {seed}")
    return TrainResult(state=state, return_mean=stats.means()[0], history=logger.rows, log_dir=run_dir,
                       eval_returns=evaluation.returns if evaluation is not None else None)


