"""What the serial loop builds from a plan (`fnrl.run.plan.Plan`) before its first step: the envs
and the compiled agent, the initial (or resumed) state, the evaluation, the progress log and
the update's threads."""
from __future__ import annotations

import sys
import warnings

import numpy as np
import torch

from fnrl import envs, rng
from fnrl.accel import compiled, tiered
from fnrl.accel.cudagraphs import check_cuda_graphs
from fnrl.distributed.data_parallel import RowsOnly
from fnrl.run.callbacks import for_run as callbacks_for_run
from fnrl.run.checkpoint import restore_state
from fnrl.run.progress import Progress
from fnrl.run.tracking import tracker_for
from fnrl.run.threads import update_threads_for


def env_and_agent(plan, world):
    """(the envs, the agent, whether off-policy updates run as the fused learner step)."""
    config, rows = plan.config, plan.rows
    if rows:
        from fnrl import seeds as vmapped
    if plan.sampler == "graph":   # the env's dynamics in torch, compiled into the rollout (fnrl.samplers.graph)
        from fnrl.envs import functional

        env = functional.make(config.env_id, plan.width * config.num_envs, seed=rng.derive(plan.seed, rng.ENV))
    elif rows:
        env = vmapped.make_env(config.env_id, rows, config.num_envs, **config.env_kwargs)
    else:   # each env of each rank its own seed (fnrl.rng)
        env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(plan.seed, config.num_envs, world.rank),
                        **config.env_kwargs)
    # one compiled graph samples and updates (fnrl.learner): row replay without frame dedup, one seed
    fused = (plan.accel.fused_learner and plan.compile and plan.off_policy and not rows and not plan.sequence_replay
             and not env.spec.is_atari)
    check_cuda_graphs(plan.cuda_graphs, device=plan.device, compile=plan.compile, algo=plan.name,
                      off_policy=plan.off_policy, fused_learner=fused and world.size == 1,
                      single=not rows and world.size == 1)
    if rows:
        agent = vmapped.make_agent(plan.module, rows, env.spec, config.num_envs, plan.compile, accel=plan.accel)
    elif plan.tiered and tiered.applies(plan.module, config, env.spec, plan.device, plan.accel,
                                        single=world.size == 1, sampler=plan.sampler, cuda_graphs=plan.cuda_graphs):
        agent = tiered.TieredAgent(plan.module, config, env.spec, plan.accel)
        if world.main and not plan.quiet:
            print("fnrl: training on the eager steps while the compiled ones build in the background "
                  "(progress.csv's tier column shows the switch; --compile waits for them instead)", flush=True)
    else:
        agent = compiled.make_agent(plan.module, config, env.spec, plan.compile, update_compiled_by_learner=fused,
                                    accel=plan.accel)
    if plan.cuda_graphs and not plan.off_policy:   # the update and the acting step, each replayed from a CUDA graph
        from fnrl.accel.cudagraphs import graphed_on_policy

        agent = graphed_on_policy(agent, plan.module.SPEC.act_keys,
                                  getattr(config, "core", "none") != "none")
    return env, agent, fused


def guards_skipped(plan) -> bool:
    """Whether the warm loop skips TorchDynamo's guard checks (`fnrl.accel.compiled.HeldStance`):
    compiled steps that keep their shapes (not vmapped off-policy rows, not sequence replay)."""
    return (plan.compile and plan.accel.skip_guards and not (plan.rows and plan.off_policy)
            and not plan.sequence_replay)


def tier_of(plan, agent) -> str:
    """Which steps the loop's last update ran: "eager", "compiled", or a tiered agent's last tier."""
    return agent.last_tier if isinstance(agent, tiered.TieredAgent) else "compiled" if plan.compile else "eager"


def close_agent(agent) -> None:
    """A tiered agent's end (in the loop's `finally`): a builder still running is left to finish,
    or stopped where an exception (a stop signal's, an error) ends the run."""
    if isinstance(agent, tiered.TieredAgent):
        agent.close(interrupted=sys.exc_info()[0] is not None)


def initial_state(plan, world, agent):
    """(the training state on the plan's device, the same on every rank; the loop's counters),
    continued from the checkpoint of a resumed run."""
    state = agent.init(plan.seed)
    counters = {"env_steps": 0, "updates": 0, "episodes": 0, "wall_s": 0.0}
    if plan.ckpt is not None:
        state = restore_state(state, plan.ckpt["state"], plan.resume)
        counters = plan.ckpt["counters"]
        if world.main:   # the checkpoint holds rank 0's RNG; other ranks reseed from where the run stands
            torch.set_rng_state(plan.ckpt["torch_rng"])
            np.random.set_state(plan.ckpt["numpy_rng"])
        else:
            rng.seed_everything(plan.seed, world.rank, counters["env_steps"])
    return world.broadcast_state(state.to(plan.device)), counters


def run_evaluation(plan, world, start: int, run_dir=None):
    """The run's evaluations on separate envs (`fnrl.evaluate.RunEvaluation`), on the main process;
    with `plan.capture_video`, recording into `run_dir / videos`."""
    config = plan.config
    if plan.eval_episodes and plan.eval_interval is None and not envs.known(config.env_id):
        warnings.warn(f"{config.env_id} has no EnvPool or gymnasium env to evaluate on; the run ends without its "
                      "final evaluation", stacklevel=4)
        return None
    if not (plan.eval_episodes and world.main):
        return None
    from fnrl.evaluate import RunEvaluation

    rows = plan.rows
    return RunEvaluation(plan.name, [row.config for row in rows] if rows else [config],
                         [row.seed for row in rows] if rows else [plan.seed], plan.eval_episodes,
                         interval=plan.eval_interval, start=start, device=plan.device,
                         capture=video_folder(plan, run_dir))


def video_folder(plan, run_dir):
    """Where `--capture-video` writes the evaluations' episodes (None without it)."""
    return run_dir / "videos" if plan.capture_video and run_dir is not None else None


def run_progress(plan, world, run_dir, counters) -> Progress:
    """progress.csv (appended to on resume), TensorBoard and the bar; rank 0 writes, the others keep rows."""
    from fnrl.logger import Logger

    logger = (Logger(run_dir, tensorboard=plan.tensorboard, resumed_at=_resumed_at(plan),
                     tracker=tracker_for(plan, run_dir)) if world.main else RowsOnly())
    logger.group_keys = tuple(plan.sweep or ())
    episodes = plan.ckpt.get("episodes") if plan.ckpt is not None else None
    return Progress(logger, f"{plan.name} {plan.config.env_id}", plan.config.total_steps, plan.width, world=world,
                    quiet=plan.quiet, labels=[row.labels for row in plan.rows] if plan.rows else None,
                    counters=counters, episodes=episodes)


def update_threads(plan, world, env) -> int | None:
    """The update's torch threads (`update_threads_for`; several ranks on one machine already share
    its cores); where that is not one thread in one process, EnvPool's recv sleeps instead of polling."""
    threads = plan.update_threads
    if threads is None:
        images = isinstance(env.spec.obs_shape, tuple) and len(env.spec.obs_shape) == 3
        threads = (update_threads_for(plan.config, plan.off_policy, plan.width, plan.threads, images)
                   if world.size == 1 else plan.threads)
    if not (plan.threads == threads == 1 and world.size == 1) and isinstance(env, envs.BatchedEnv):
        # a polling recv would be one busy thread too many: idle OpenMP threads of a multi-thread act or
        # update spin on into the collect (docs/decisions.md), and ranks share the cores
        env.poll = False
    return threads


def _resumed_at(plan) -> int | None:
    """The env steps of the checkpoint a resumed run continues, as progress.csv counts them (all
    ranks together); None for a new run."""
    if plan.ckpt is None:
        return None
    return plan.ckpt["counters"]["env_steps"] * plan.ckpt.get("world_size", 1)


def run_callbacks(plan, world, run_dir):
    """The run's callbacks (`fnrl.run.callbacks.for_run`: the user's, and `best.pt`'s), on the main
    process."""
    return callbacks_for_run(plan, run_dir, world.main)
