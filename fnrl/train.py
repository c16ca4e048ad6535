"""`train(name, config, **options)`: one training run, resolved, checked and handed to its loop.

    result = train("ppo", ppo.Config(total_steps=50_000), seed=1, log_dir="runs/x")
    result.return_mean, result.eval_return_mean, result.history, result.state

`fnrl.run.plan.make_plan` resolves the run (preset, resumed checkpoint, vmapped rows) and checks
every option before any work; the plan's runtime picks the loop: `fnrl.loops.serial` (on- and
off-policy, one seed, vmapped seeds, or one rank of a data-parallel run), `fnrl.train_async`
(`--sampler async`) or `fnrl.train_central` (IMPALA's actor processes). The run folder, the
checkpoint and the NaN checks are `fnrl.run`'s.
"""
from __future__ import annotations

import os

import torch

from fnrl import algos, envs, rng
from fnrl.accel.inductor import apply_workarounds
from fnrl.accel.options import AccelOptions
from fnrl.errors import ConfigError
from fnrl.loops.serial import train_serial
from fnrl.run.checkpoint import CHECKPOINT, CHECKPOINT_FORMAT, load_checkpoint, save_checkpoint
from fnrl.run.folder import write_config_json
from fnrl.run.health import TrainingError
from fnrl.run.plan import make_plan
from fnrl.run.result import TrainResult
from fnrl.run.threads import environ, update_threads_for

__all__ = ["train", "TrainResult", "TrainingError", "load_checkpoint", "save_checkpoint", "write_config_json",
           "update_threads_for", "CHECKPOINT", "CHECKPOINT_FORMAT"]


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
    Other keywords: see `plan_run`.
    """
    if env_threads is not None:
        if env_threads < 0:
            raise ConfigError(f"--env-threads must be >= 0 (0: one per core), got {env_threads}")
        with environ(envs.ENV_THREADS_VAR, str(env_threads)):
            return train(name, config, nproc=nproc, **kwargs)
    if nproc is not None and nproc != 1:
        from fnrl.distributed.launch import train_processes

        if kwargs.get("callbacks"):
            raise ConfigError("callbacks run in single-process runs; drop nproc or the callbacks")

        return train_processes(train, nproc, name, config, **kwargs)
    from fnrl.distributed import World, world_from_env

    if kwargs.get("actor_hosts") and int(os.environ.get("WORLD_SIZE", "1")) > 1:   # torchrun: rank 0 learns
        from fnrl.distributed.hosts import torchrun_rendezvous

        if kwargs.get("resume") is not None:
            raise ConfigError("--resume does not continue a torchrun run with --actor-hosts (its actor ranks "
                              "cannot read the checkpoint's config); start a new run")
        rendezvous, rank = torchrun_rendezvous(kwargs["actor_hosts"])
        if rank > 0:
            plan_run(World(), name, config, **kwargs)   # the learner's ConfigError here too, before any wait
            if algos.load(name).SPEC.runtime == "central" and kwargs.get("sampler") in (None, "serial"):
                from fnrl.train_central import act_as_env_host as act_as_host
            else:
                from fnrl.train_async import act_as_host
            return act_as_host(rendezvous, rank, name, config, **kwargs)
        return run(World(), name, config, **kwargs)
    world = world_from_env(kwargs.get("device", "cpu"))
    try:
        return run(world, name, config, **kwargs)
    finally:
        world.close()


def run(world, name: str, config=None, **options) -> TrainResult:
    """One process (of `world`, a fnrl.distributed World) of `train`: the plan (`plan_run`), then its loop."""
    apply_workarounds()
    plan = plan_run(world, name, config, **options)
    if plan.threads is not None:
        torch.set_num_threads(plan.threads)
    rng.seed_everything(plan.seed, world.rank)
    if plan.runtime == "async":
        from fnrl.train_async import train_async

        return train_async(plan)
    if plan.runtime == "central":   # actor processes + central inference (IMPALA)
        from fnrl.train_central import train_central

        return train_central(plan)
    return train_serial(plan, world)


def plan_run(world, name: str, config=None, *, seed: int = 0, log_dir=None, device: str = "cpu",
        compile: bool | str = True,
        quiet: bool = False, resume=None, log_interval: int | None = None, checkpoint_every: int | None = None,
        threads: int | None = 1, update_threads: int | None = None, tensorboard: bool = True,
        plot: bool = True, stop_return: float | None = None, eval_interval: int | None = None,
        eval_episodes: int = 10, capture_video: bool = False, track: str | None = None,
        sampler: str | None = None, sampler_workers: int | None = None, num_seeds: int = 1, sweep: dict | None = None,
        cuda_graphs: bool = False, preset: str | None = None, actor_hosts: int = 0,
        accel: AccelOptions | None = None, changes: dict | None = None, callbacks=None):
    """The checked plan (`fnrl.run.plan.Plan`) of one process of `train`; raises ConfigError before any work.

    compile: True compiles the update and acting before the first step; False runs them eagerly;
        "tiered" (the command line's default) trains on the eager steps at once while a builder
        process compiles them, and switches at an iteration boundary once they are ready
        (`fnrl.accel.tiered`; one seed of a feed-forward policy on the CPU: PPO, the DQN family
        and DDPG / TD3 / SAC with row replay; other runs compile first). progress.csv's `tier` column
        says which steps each row ran.
    log_interval: env steps between log rows (default: about 100 rows per run).
    checkpoint_every: env steps between checkpoints (default: 10 per run, and the end).
    threads: torch intra-op threads (1 suits small networks on a few cores; None keeps
        torch's default).
    update_threads: torch intra-op threads while the serial loop updates (default: see
        `update_threads_for`: every core for updates of at least 2048 x 64 x 64 multiply-adds
        per layer or of images, else `threads`).
    resume: a run folder; training continues from its checkpoint with its config (and, where the
        checkpoint holds them, its replay buffer and the graph sampler's envs; see `checkpoint`).
    changes: with `resume`, Config fields given again (as `fnrl train ... --resume DIR` passes
        them): each must equal the checkpoint's, except `total_steps`, which extends the run (to
        more env steps than it has run; schedules over the run, such as learning-rate annealing
        and exploration, stretch to the new length).
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
    track: also send the progress rows, config and videos to "wandb" or "mlflow" (`fnrl.run.tracking`).
    capture_video: record the first episode of every evaluation (row 0's env 0) to
        `RUN/videos/eval-<env steps>.mp4` (H.264, with the `video` extra's imageio-ffmpeg; else .gif),
        and to TensorBoard (`videos/eval`, as animated GIFs).
    sampler: how rollouts are collected: a name of fnrl.samplers (serial, alternating,
        parallel, graph: the env's dynamics in torch, compiled with the policy into one call per
        rollout, for the envs of fnrl.envs.functional: CartPole, Acrobot, Pendulum, MountainCar),
        or "async" (off-policy: sampling in its own process, see fnrl.train_async). Default: serial;
        a resumed run's, the one its checkpoint was written with.
    sampler_workers: worker processes of the parallel sampler (default: one per core).
    actor_hosts: with sampler="async", N actor hosts feed the learner's replay over
        torch.distributed instead of one sampler process over shared memory
        (`fnrl.distributed.actors`, Ape-X); with impala, N env hosts are its actors, the learner
        acting for them (`fnrl.distributed.env_hosts`, SEED RL). Started here as N local processes
        over loopback, or the other ranks of a torchrun launch.
    cuda_graphs: replay steps from CUDA graphs (`fnrl.accel.cudagraphs`; needs --device cuda and
        compile): off-policy, the fused learner step (one seed, a row replay without frame
        stacks); on-policy (PPO, A2C), the update and a feed-forward policy's acting step (one
        seed, one process, the serial sampler).
    callbacks: objects with `on_log` / `on_eval` / `on_checkpoint` methods, called by the loop at
        every log row, evaluation and checkpoint; `on_log` / `on_eval` returning True stops the run
        (with its checkpoint). See `fnrl.run.callbacks`. A run that evaluates while it trains
        (`eval_interval`) also keeps the policy of its best evaluation in `best.pt`.
    accel: the speed options of a compiled run (`fnrl.accel.AccelOptions`: ahead-of-time models,
        skipped guard checks, the fused off-policy learner step); default: all on, unless
        `$FNRL_AHEAD_OF_TIME`, `$FNRL_SKIP_GUARDS` or `$FNRL_FUSED_LEARNER` is 0. They change
        how steps run, not what they compute.
    """
    return make_plan(world, name, config, seed=seed, log_dir=log_dir, device=device, compile=compile, quiet=quiet,
                     resume=resume, log_interval=log_interval, checkpoint_every=checkpoint_every, threads=threads,
                     update_threads=update_threads, tensorboard=tensorboard, plot=plot, stop_return=stop_return,
                     eval_interval=eval_interval, eval_episodes=eval_episodes, capture_video=capture_video, track=track,
                     sampler=sampler,
                     sampler_workers=sampler_workers, actor_hosts=actor_hosts, num_seeds=num_seeds, sweep=sweep,
                     cuda_graphs=cuda_graphs,
                     preset=preset, accel=accel, changes=changes, callbacks=callbacks or [])
