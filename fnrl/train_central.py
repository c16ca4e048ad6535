"""The learner loop of algorithms with central inference (`SPEC.runtime == "central"`, IMPALA).

`fnrl.train.train` hands such algorithms here. Actor processes step the envs and a
central inference server in this process acts for them (fnrl.samplers.central); this
loop pops `batch_size` trajectories at a time, makes one update, serves the new
parameters (policy version + 1), and logs and checkpoints through the same helpers as
`train` (Logger, save_checkpoint, the run folder). Besides train's columns, progress.csv
holds `policy_lag_mean` (learner version minus the behaviour version of the consumed
steps, averaged over the interval), `policy_lag_max`, and `inference_batch` (mean
actor requests per inference forward).

With `--actor-hosts N` the actors are N env hosts over torch.distributed
(`fnrl.distributed.env_hosts`, SEED RL): local processes, or ranks 1..N of a torchrun launch
(`act_as_env_host`); progress.csv adds `actors`, `actors_lost` and `discarded`.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fnrl import envs, rng
from fnrl.accel.compiled import compile_update
from fnrl.run.cadence import cadences
from fnrl.run.callbacks import for_run as callbacks_for_run
from fnrl.run.checkpoint import CHECKPOINT, checkpoint_payload, save_checkpoint
from fnrl.run.folder import prepare_run_dir, release_run_dir, write_config_json
from fnrl.run.health import check_finite as finite_scalars, stopped_by
from fnrl.run.progress import Progress
from fnrl.run.tracking import tracker_for
from fnrl.run.result import TrainResult
from fnrl.run.stop import StopRequest


def train_central(plan) -> TrainResult:
    """Train `plan` (`fnrl.run.plan.Plan`, runtime "central") with actor processes and central inference.

    Raises TrainingError (one line) if an actor dies, the inference server fails, or a loss
    becomes NaN; the last checkpoint stays intact.
    """
    from fnrl.errors import SamplerError
    from fnrl.logger import Logger
    from fnrl.samplers.central import ActorError

    name, config, ckpt = plan.name, plan.config, plan.ckpt
    update, state, counters, sampler, run_dir = _start(plan)
    last_checkpoint = run_dir / CHECKPOINT
    callbacks = callbacks_for_run(plan, run_dir)
    version = counters["updates"]
    progress = Progress(Logger(run_dir, tensorboard=plan.tensorboard,
                               resumed_at=ckpt["counters"]["env_steps"] if ckpt is not None else None,
                               tracker=tracker_for(plan, run_dir)),
                        f"{name} {config.env_id}", config.total_steps, quiet=plan.quiet, counters=counters,
                        episodes=ckpt.get("episodes") if ckpt is not None else None)
    evaluation = None
    if plan.eval_episodes:
        from fnrl.evaluate import RunEvaluation
        from fnrl.loops.build import video_folder

        evaluation = RunEvaluation(name, [config], [plan.seed], plan.eval_episodes, interval=plan.eval_interval,
                                   start=counters["env_steps"], device=plan.device,
                                   capture=video_folder(plan, run_dir))

    def checkpoint():
        save_checkpoint(last_checkpoint, checkpoint_payload(
            algo=name, seed=plan.seed, config=dataclasses.asdict(config), state=state, counters=counters,
            preset=plan.preset, episodes=progress.stats.state_dict()))

    steps_per_update = config.num_steps * config.num_envs * config.batch_size
    log, save = cadences(plan, steps_per_update, counters["env_steps"])
    lags: list[torch.Tensor] = []
    metrics, seen = {}, (0, 0)   # seen: the inference server's forwards and requests at the last row
    stop = StopRequest().start()
    try:
        try:
            sampler.start()
        except (ActorError, SamplerError) as e:   # an env host failed before the run started
            raise stopped_by(e, counters["env_steps"], last_checkpoint) from None
        while counters["env_steps"] < config.total_steps:
            try:
                batch = sampler.get(config.batch_size)
            except ActorError as e:   # during a stop: the stop's exit, with a checkpoint
                failure = stopped_by(e, counters["env_steps"], last_checkpoint)
                raise stop.or_failure(failure, checkpoint, run_dir, counters["env_steps"]) from e
            counters["env_steps"] += steps_per_update
            state["env_steps"] += steps_per_update
            lags.append((version - batch["version"])[batch["valid"]])
            progress.add(batch)
            state, metrics = update(state, batch.exclude("version", "episode_end", "episode_return",
                                                         "episode_length"))
            version += 1
            counters["updates"] += 1
            sampler.set_state(state, version)
            progress.advance(steps_per_update)
            solved = False
            done = counters["env_steps"] >= config.total_steps
            if log.due(counters["env_steps"]) or done:
                log.passed(counters["env_steps"])
                scalars = finite_scalars(metrics, counters["env_steps"], last_checkpoint)
                solved = progress.close_interval(counters, plan.stop_return)
                evaluations = evaluation(state, counters["env_steps"], solved or done) if evaluation else None
                extra, seen = _lag_columns(torch.cat(lags).float(), sampler, seen)
                logged = progress.write(counters, evaluations, [scalars], extra=extra,
                                        postfix={"lag": f"{extra['policy_lag_mean']:.1f}"})
                solved = callbacks.logged(counters["env_steps"], logged, state) or solved
                lags = []
            if solved or done or save.due(counters["env_steps"]) or stop.requested:
                save.passed(counters["env_steps"])
                finite_scalars(metrics, counters["env_steps"], last_checkpoint)
                checkpoint()
                callbacks.checkpointed(counters["env_steps"], last_checkpoint, state)
            if solved:
                break
            if stop.requested:   # SIGTERM / SIGINT: stopped here, with the checkpoint just written
                raise stop.stopped(run_dir, counters["env_steps"])
        if plan.plot:   # before the logger closes: a tracker takes the curve too
            progress.logger.plot(title=f"{name} {config.env_id} seed {plan.seed}")
    finally:
        stop.close()
        sampler.close()
        progress.close()
        release_run_dir(run_dir)
        if evaluation is not None:
            evaluation.close()
    return TrainResult(state=state, return_mean=progress.stats.means()[0], history=progress.logger.rows,
                       log_dir=run_dir, eval_returns=evaluation.returns if evaluation is not None else None)


def _start(plan):
    """(the update, compiled with `plan.compile`; the initial or resumed state; the counters; the
    central sampler, not started; the run folder)."""
    from fnrl.samplers.central import CentralSampler

    name, module, config, seed, ckpt = plan.name, plan.module, plan.config, plan.seed, plan.ckpt
    spec = envs.env_spec(config.env_id, config.num_envs, **config.env_kwargs)
    module.validate(config, spec)
    agent = module.make(config, spec)
    # the inference thread gets its own network modules: functional_call swaps a module's
    # parameters while it runs, so one module must not serve two threads at once
    inference_act = module.make(config, spec).act
    update = compile_update(agent.update) if plan.compile else agent.update
    run_dir = prepare_run_dir(plan.log_dir, name, config, seed, ckpt is not None)
    write_config_json(run_dir, name, seed, config, plan.preset, actor_hosts=plan.actor_hosts)
    state = agent.init(seed)
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    if ckpt is not None:
        state, counters = ckpt["state"], ckpt["counters"]
        torch.set_rng_state(ckpt["torch_rng"])
        np.random.set_state(ckpt["numpy_rng"])
    state = state.to(plan.device)
    if plan.actor_hosts:
        sampler = _env_hosts(plan, inference_act, state, spec)
    else:
        sampler = CentralSampler(config.env_id, config.num_envs, config.num_actors, inference_act, state,
                                 horizon=config.num_steps, obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype,
                                 seed=seed, num_slots=config.queue_size, batch_wait_s=config.batch_wait_ms / 1000,
                                 device=plan.device, env_kwargs=config.env_kwargs)
    sampler.set_state(state, counters["updates"])
    return update, state, counters, sampler, run_dir


def _env_hosts(plan, act, state, spec):
    """The `fnrl.distributed.env_hosts.EnvHosts` of a run with --actor-hosts: local processes, or
    the other ranks of this torchrun launch."""
    from fnrl.distributed.env_hosts import EnvHosts
    from fnrl.distributed.hosts import torchrun_rendezvous

    config, hosts = plan.config, plan.actor_hosts
    torchrun = torchrun_rendezvous(hosts)   # None: the hosts are local processes started here
    return EnvHosts(act, state, hosts=hosts, num_envs=config.num_envs, horizon=config.num_steps,
                    obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype, num_slots=config.queue_size,
                    batch_wait_s=config.batch_wait_ms / 1000, device=plan.device,
                    rendezvous=torchrun and torchrun[0],
                    spawn=None if torchrun else (_build_env_host, (config, plan.seed, hosts), plan.seed, plan.threads))


def _build_env_host(config, seed: int, hosts: int, index: int):
    """Run on env host `index` (`fnrl.distributed.hosts.host_main`): its envs, seeded as actor
    `index` of a one-machine run, and the loop stepping them for the learner."""
    from fnrl.distributed.env_hosts import stepping_loop

    B = config.num_envs
    env = envs.make(config.env_id, B, seed=rng.env_seeds(seed, hosts * B)[index * B:(index + 1) * B],
                    **config.env_kwargs)
    env.poll = False   # the host may share its cores with the learner: EnvPool's recv sleeps at once
    return env, stepping_loop(env)


def act_as_env_host(rendezvous, rank: int, name: str, config=None, *, seed: int = 0, threads: int | None = 1,
                    **ignored) -> None:
    """Rank `rank` > 0 of a torchrun launch of `name` (IMPALA) with --actor-hosts: step envs for
    the learner at rank 0 until it stops, then end the process (`fnrl.distributed.hosts.run_host`)."""
    from fnrl.distributed.hosts import run_host
    from fnrl.presets import configure

    config = config if config is not None else configure(name)[0]
    run_host(rendezvous, rank, _build_env_host, (config, seed, rendezvous.world_size - 1), seed=seed,
             threads=threads)


def _lag_columns(lag: torch.Tensor, sampler, seen: tuple[int, int]) -> tuple[dict, tuple[int, int]]:
    """The central columns of a log row (policy lag of the interval's steps, actor requests per
    inference forward) and the server's (forwards, requests) now."""
    forwards, requests = sampler.forwards, sampler.requests
    nan = float("nan")
    return {"policy_lag_mean": float(lag.mean()) if lag.numel() else nan,
            "policy_lag_max": float(lag.max()) if lag.numel() else nan,
            "inference_batch": (requests - seen[1]) / max(forwards - seen[0], 1), **sampler.columns()}, \
        (forwards, requests)
