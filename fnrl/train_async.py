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
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from fnrl import algos, envs, rng
from fnrl.errors import ConfigError
from fnrl.replay import snapshot as replay_snapshot
from fnrl.replay.shared import SharedReplay
from fnrl.replay.sharded import ShardedReplay
from fnrl.samplers.async_ import POLL_S, AsyncSampler, SamplerError, SharedParams, Throttle, TimedLock
from fnrl.samplers.serial import SerialSampler
from fnrl.accel.compiled import make_agent
from fnrl.loops.off_policy import init_replay
from fnrl.run.cadence import cadences
from fnrl.run.callbacks import for_run as callbacks_for_run
from fnrl.run.checkpoint import CHECKPOINT, checkpoint_payload, resumed_replay, save_checkpoint
from fnrl.run.folder import prepare_run_dir, release_run_dir, write_config_json
from fnrl.run.health import TrainingError, check_finite as finite_scalars
from fnrl.run.progress import Progress
from fnrl.run.result import TrainResult
from fnrl.run.stop import StopRequest
from fnrl.run.tracking import tracker_for

ACT_KEYS = ("params", "obs_rms")
"""State keys an off-policy `act` may read besides env_steps (a module may declare its own `SPEC.act_keys`)."""

PUBLISH_EVERY = 4
"""Updates between two parameter publications (also published whenever the optimizer waits)."""


def check_async(name: str, module, config, sampler_device: str = "cpu", max_lead_collects: int | None = 4) -> None:
    """Raise ConfigError (one line) for settings the async sampler cannot run."""
    if not module.SPEC.off_policy:
        raise ConfigError(f"--sampler async runs off-policy algorithms (dqn family, ddpg, td3, sac); {name} is "
                          f"on-policy: use --sampler serial")
    if module.SPEC.replay == "sequence":
        raise ConfigError(f"--sampler async does not support sequence replay ({name}) yet; use --sampler serial")
    if torch.device(sampler_device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"sampler_device={sampler_device} asked for CUDA but none is available; use 'cpu'")
    if max_lead_collects is not None and max_lead_collects < 1:
        raise ConfigError(f"max_lead_collects must be >= 1 (or None for no sampler throttle), got {max_lead_collects}")


def _build_actor(name: str, config, seed: int, index: int = 0):
    """Run in the sampler process: its own env (each env seeded from the run's seed and the
    actor's index, `fnrl.rng`), the policy's act and an initial state."""
    module = algos.load(name)
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs, rank=index),
                    **config.env_kwargs)
    env.poll = False   # the sampler shares the cores with the learner: EnvPool's recv sleeps at once
    agent = module.make(config, env.spec)
    return env, agent.act, agent.init(seed)


def _actor_priorities(module, config) -> bool:
    """Whether actor hosts compute initial priorities (Ape-X): prioritized replay and a module that
    defines `initial_priorities(config, env_spec)` (the DQN family)."""
    return bool(getattr(config, "prioritized", False)) and hasattr(module, "initial_priorities")


def _build_actor_host(name: str, config, seed: int, throttle: Throttle, device: str, index: int):
    """Run on actor host `index` (`fnrl.distributed.hosts.host_main`): `_build_actor`'s env, and the
    loop acting with its policy under the run's throttle (`fnrl.distributed.actors.acting_loop`),
    scoring its rollouts' initial priorities where `_actor_priorities` says so."""
    from fnrl.distributed.actors import WindowPriorities, acting_loop

    env, act, state = _build_actor(name, config, seed, index)
    module = algos.load(name)
    priorities = WindowPriorities(module.initial_priorities(config, env.spec), config.n_step) \
        if _actor_priorities(module, config) else None
    return env, acting_loop(env, act, state, throttle, config.num_steps, device, priorities)


def train_async(plan, *, sampler_device: str = "cpu", max_lead_collects: int | None = 4,
                stall_timeout: float = 300.0) -> TrainResult:
    """Train `plan` (`fnrl.run.plan.Plan` of an off-policy algorithm) with the async sampler.

    device: where the optimizer (update) runs, e.g. "cuda"; sampler_device: where the
      sampler's acting copy runs ("cpu" by default, or a second GPU such as "cuda:1").
    max_lead_collects: the sampler waits while the optimizer owes more than this many
      collects (num_steps x num_envs env steps) of updates; None lets it run free.
    stall_timeout: seconds a live sampler may go without progress before the run fails.
    Raises TrainingError (one line) if the sampler process fails, dies or stalls, or a
    loss becomes NaN; the last checkpoint stays intact.
    """
    config, ckpt = plan.config, plan.ckpt
    check_async(plan.name, plan.module, config, sampler_device, max_lead_collects)
    run = _start(plan, sampler_device, max_lead_collects, stall_timeout)
    state, counters, sampler, replay, throttle = run.state, run.counters, run.sampler, run.replay, run.throttle
    last_checkpoint = run.run_dir / CHECKPOINT
    callbacks = callbacks_for_run(plan, run.run_dir)

    def checkpoint():
        save_checkpoint(last_checkpoint, checkpoint_payload(
            algo=plan.name, seed=plan.seed, config=dataclasses.asdict(config), state=state, counters=counters,
            preset=plan.preset, sampler="async", episodes=progress.stats.state_dict(),
            replay=replay.snapshot() if _keeps_replay(replay) else None))

    from fnrl.logger import Logger

    progress = evaluation = None
    stop = StopRequest().start()
    try:
        sampler.start()   # spawned processes: they inherit none of this process's threads
        evaluation = _evaluation(plan, counters["env_steps"], run.run_dir)
        progress = Progress(Logger(run.run_dir, tensorboard=plan.tensorboard,
                                   resumed_at=ckpt["counters"]["env_steps"] if ckpt is not None else None,
                                   tracker=tracker_for(plan, run.run_dir)),
                            f"{plan.name} {config.env_id} async", config.total_steps, quiet=plan.quiet,
                            counters=counters, episodes=ckpt.get("episodes") if ckpt is not None else None)
        log, save = cadences(plan, config.num_steps * config.num_envs, counters["env_steps"])
        metrics, solved, idle = {}, False, 0.0
        env_steps, published = counters["env_steps"], counters["updates"]
        seen = sampler.read()
        while True:
            sampler.check()
            snap = sampler.read()
            progress.advance(snap["env_steps"] - env_steps)
            env_steps = snap["env_steps"]
            state["env_steps"].fill_(env_steps)
            due = throttle.due(env_steps)
            state, metrics, done, starved = _updates(run, state, metrics, env_steps, due)
            updates = counters["updates"]
            if updates != published and (done == 0 or done == PUBLISH_EVERY or updates >= due):
                run.params.publish(state.select(*run.act_keys), updates)
                published = updates
            sampler.notify(updates, can_sample=not starved)
            counters["env_steps"] = env_steps
            finished = snap["done"] and (updates >= due or starved)
            # a row is written once the updates the serial loop makes by the log boundary are done
            caught_up = updates >= throttle.due(log.next) or starved
            if (log.due(env_steps) and caught_up and env_steps < config.total_steps) or finished:
                log.passed(env_steps)
                scalars = finite_scalars(metrics, env_steps, last_checkpoint)
                progress.add_returns(sampler.returns_since(seen["episodes"]))
                episodes = counters["episodes"] + snap["episodes"] - seen["episodes"]
                solved = progress.close_interval(counters, plan.stop_return)
                counters["episodes"] = episodes   # the sampler's count: its ring keeps only the latest returns
                evaluations = evaluation(state, env_steps, final=solved or finished) if evaluation else None
                lag = updates - snap["version"]
                logged = progress.write(counters, evaluations, [{k: v for k, v in scalars.items() if k != "priority"}],
                                        extra=_waits(progress.interval_s, idle, snap, seen, lag), postfix={"lag": lag})
                solved = callbacks.logged(env_steps, logged, state) or solved
                seen, idle = snap, 0.0
            if solved or finished or save.due(env_steps) or stop.requested:
                save.passed(env_steps)
                finite_scalars(metrics, env_steps, last_checkpoint)
                checkpoint()
                callbacks.checkpointed(env_steps, last_checkpoint, state)
            if solved or finished:
                break
            if stop.requested:   # SIGTERM / SIGINT: stopped here, with the checkpoint just written
                raise stop.stopped(run.run_dir, env_steps)
            if done == 0:
                t = time.perf_counter()
                sampler.wait_for_data(POLL_S)
                idle += time.perf_counter() - t
        if plan.plot:   # before the logger closes: a tracker takes the curve too
            progress.logger.plot(title=f"{plan.name} {config.env_id} seed {plan.seed} (async)")
    except (SamplerError, TimeoutError) as e:   # during a stop: the stop's exit, with a checkpoint
        failure = TrainingError(f"{e}; the last checkpoint is {last_checkpoint}")
        raise stop.or_failure(failure, checkpoint, run.run_dir, counters["env_steps"]) from None
    finally:
        stop.close()
        sampler.stop()
        release_run_dir(run.run_dir)
        if progress is not None:
            progress.close()
        if evaluation is not None:
            evaluation.close()
    return TrainResult(state=state, return_mean=progress.stats.means()[0], history=progress.logger.rows,
                       log_dir=run.run_dir, eval_returns=evaluation.returns if evaluation is not None else None)


@dataclasses.dataclass
class _AsyncRun:
    """What `train_async` starts from: the run folder, the learner's state and counters, the shared
    replay and parameters, the sampler (not started yet) and its throttle."""

    run_dir: Path
    config: object
    device: str
    agent: object
    state: object
    counters: dict
    replay: SharedReplay | ShardedReplay
    params: object
    """`SharedParams`, or the `ActorHosts` (which publish to the actors)"""
    act_keys: list
    throttle: Throttle
    sampler: object
    """`AsyncSampler`, or `fnrl.distributed.actors.ActorHosts` with --actor-hosts"""


def _start(plan, sampler_device: str, max_lead_collects: int | None, stall_timeout: float) -> _AsyncRun:
    name, module, config, seed, ckpt = plan.name, plan.module, plan.config, plan.seed, plan.ckpt
    probe = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs), **config.env_kwargs)
    spec = probe.spec
    agent = make_agent(module, config, spec, plan.compile, accel=plan.accel)
    state = agent.init(seed)
    try:
        example = SerialSampler(probe, agent.act, 1).collect(state).clone()   # [1, B]: the replay's row layout
    finally:
        probe.close()
    run_dir = prepare_run_dir(plan.log_dir, name, config, seed, ckpt is not None)
    write_config_json(run_dir, name, seed, config, plan.preset, sampler="async", device=str(plan.device),
                      sampler_device=str(sampler_device), actor_hosts=plan.actor_hosts)
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    if ckpt is not None:
        state, counters = ckpt["state"], dict(ckpt["counters"])
        torch.set_rng_state(ckpt["torch_rng"])
        np.random.set_state(ckpt["numpy_rng"])
    state = state.to(plan.device)
    # a fresh interpreter: a forked child inherits this process's threads' locks (compile workers,
    # thread pools of earlier runs), and one held at the fork hangs the child for good
    ctx_method = "spawn"
    ctx = torch.multiprocessing.get_context(ctx_method)
    replay = _replay(plan, example, spec, ctx)
    act_keys = [k for k in module.SPEC.act_keys or ACT_KEYS if k != "env_steps" and k in state.keys(True)]
    throttle = _throttle(config, max_lead_collects)
    if plan.actor_hosts:
        from fnrl.distributed.actors import ActorHosts
        from fnrl.distributed.hosts import torchrun_rendezvous

        torchrun = torchrun_rendezvous(plan.actor_hosts)   # None: the hosts are local processes started here
        sampler = params = ActorHosts(
            replay, state.select(*act_keys), example.expand(config.num_steps, config.num_envs),
            hosts=plan.actor_hosts, total_steps=config.total_steps, start_env_steps=counters["env_steps"],
            rendezvous=torchrun and torchrun[0], version=counters["updates"],
            priorities=_actor_priorities(module, config),
            spawn=None if torchrun else (_build_actor_host, (name, config, seed, throttle, sampler_device), seed,
                                         plan.threads))
    else:
        params = SharedParams(state.select(*act_keys), TimedLock(ctx.Lock()))
        params.publish(state.select(*act_keys), counters["updates"])
        sampler = AsyncSampler(_build_actor, (name, config, seed), replay, params, throttle, horizon=config.num_steps,
                               total_steps=config.total_steps, start_env_steps=counters["env_steps"],
                               device=sampler_device, seed=seed, threads=plan.threads, stall_timeout=stall_timeout,
                               method=ctx_method)
    return _AsyncRun(run_dir, config, plan.device, agent, state, counters, replay, params, act_keys, throttle, sampler)


def act_as_host(rendezvous, rank: int, name: str, config=None, *, seed: int = 0, threads: int | None = 1,
                sampler_device: str = "cpu", max_lead_collects: int | None = 4, **ignored) -> None:
    """Rank `rank` > 0 of a torchrun launch with --actor-hosts: act for the learner at rank 0
    until it stops, then end the process (`fnrl.distributed.hosts.run_host`)."""
    from fnrl.distributed.hosts import run_host
    from fnrl.presets import configure

    config = config if config is not None else configure(name)[0]
    run_host(rendezvous, rank, _build_actor_host,
             (name, config, seed, _throttle(config, max_lead_collects), sampler_device), seed=seed, threads=threads)


def _updates(run: _AsyncRun, state, metrics, env_steps: int, due: int):
    """Up to `PUBLISH_EVERY` of the updates due after `env_steps`, each on a replay sample:
    (state, metrics, updates made, whether the replay ran out of samples)."""
    config, counters, done = run.config, run.counters, 0
    while counters["updates"] < due and done < PUBLISH_EVERY:
        beta = config.priority_beta + (1.0 - config.priority_beta) * env_steps / config.total_steps
        sampled_at = run.replay.steps_written   # read first: a row written after it is never updated
        batch = run.replay.sample(config.batch_size, beta=beta)
        if batch is None:
            return state, metrics, done, True
        state, metrics = run.agent.update(state, batch.to(run.device, non_blocking=True))
        if config.prioritized:
            run.replay.update_priorities(batch["index"], metrics["priority"], sampled_at)
        counters["updates"] += 1
        done += 1
    return state, metrics, done, False


def _waits(span: float, idle: float, snap: dict, seen: dict, lag: int) -> dict:
    """The async columns of a log row: policy lag, and the interval's share each process waited."""
    hosts = {k: snap[k] for k in ("actors", "actors_lost", "discarded") if k in snap}
    return {"policy_lag": lag, "opt_wait": round(min(idle / span, 1.0), 3),
            "sampler_wait": round(min((snap["wait_s"] - seen["wait_s"]) / span, 1.0), 3), **hosts}


def _replay(plan, example, spec, ctx) -> SharedReplay | ShardedReplay:
    """The run's replay, with the rows its checkpoint holds: one shared buffer, or with actor hosts a
    shard per host (written and read in this process). A checkpoint's replay of another shape (shards
    of another host count, or none where shards are wanted) is left out with a warning."""
    config, hosts = plan.config, plan.actor_hosts
    saved = resumed_replay(plan.ckpt, plan.resume, "cpu")[0] if plan.ckpt is not None else None   # the rows it had
    wanted = hosts if hosts else None
    got = len(saved) if isinstance(saved, tuple) else None
    if saved is not None and got != wanted:
        warnings.warn(f"checkpoint {plan.resume} holds a replay of {got or 'no'} actor-host shards and this run has "
                      f"{wanted or 'no'} actor hosts; the resumed run's replay starts empty", stacklevel=3)
        saved = None
    if not hosts:
        return SharedReplay(saved if saved is not None else init_replay(config, example, spec, "cpu"),
                            TimedLock(ctx.RLock()))
    shard_config = dataclasses.replace(config, buffer_size=config.buffer_size // hosts)
    shards = saved if saved is not None else [init_replay(shard_config, example, spec, "cpu") for _ in range(hosts)]
    return ShardedReplay([SharedReplay(shard, TimedLock(threading.RLock())) for shard in shards])


def _keeps_replay(replay) -> bool:
    """Whether a checkpoint holds the replay (one buffer, or a tuple of the actor hosts' shards):
    while it is small enough."""
    return replay.nbytes <= replay_snapshot.CHECKPOINT_BYTES


def _throttle(config, max_lead_collects: int | None) -> Throttle:
    """The run's `Throttle`: the serial loop's replay ratio, the sampler at most `max_lead_collects`
    collects ahead (None: no limit)."""
    steps_per_collect = config.num_steps * config.num_envs
    return Throttle(steps_per_collect, config.learning_starts, config.replay_ratio,
                    None if max_lead_collects is None else max_lead_collects * steps_per_collect)


def _evaluation(plan, start: int, run_dir):
    if not plan.eval_episodes:
        return None
    from fnrl.evaluate import RunEvaluation
    from fnrl.loops.build import video_folder

    return RunEvaluation(plan.name, [plan.config], [plan.seed], plan.eval_episodes, interval=plan.eval_interval,
                         start=start, device=plan.device, capture=video_folder(plan, run_dir))
