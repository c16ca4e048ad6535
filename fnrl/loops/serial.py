"""The serial training loop: collect -> update -> log -> checkpoint, in one process.

    on-policy  (`SPEC.kind == "on_policy"`):  collect [T, B] -> update(state, rollout)
    off-policy (`SPEC.kind == "off_policy"`): collect [T, B] -> replay -> the updates due under
                                              `replay_ratio`, each on a replay sample (`ReplayLearner`)

It runs one seed, the vmapped rows of `--num-seeds` / `--sweep` (`fnrl.seeds`), or one rank of a
data-parallel run (`world`: gradients averaged inside the update, episodes gathered at each log
row). Compiled steps run with Dynamo's guard checks skipped once warm (`fnrl.accel.compiled`).
"""
from __future__ import annotations

import dataclasses

from fnrl import samplers
from fnrl.errors import SamplerError
from fnrl.accel import compiled
from fnrl.loops.build import (close_agent, env_and_agent, guards_skipped, initial_state, run_callbacks,
                              run_evaluation, run_progress, tier_of, update_threads)
from fnrl.loops.off_policy import ReplayLearner
from fnrl.run.cadence import cadences
from fnrl.run.checkpoint import CHECKPOINT, checkpoint_payload, save_checkpoint
from fnrl.run.folder import prepare_run_dir, release_run_dir, write_config_json
from fnrl.run.health import non_finite_losses, raise_if_loss_not_finite, scalar_metrics, stopped_by
from fnrl.run.result import TrainResult, mean_of_rows
from fnrl.run.stop import StopRequest
from fnrl.run.threads import intra_op_threads


def train_serial(plan, world) -> TrainResult:
    """Train `plan` (`fnrl.run.plan.Plan`, runtime "serial") as process `world.rank` of `world`."""
    config, rows, resumed = plan.config, plan.rows, plan.ckpt is not None
    env, agent, fused = env_and_agent(plan, world)
    sampler = samplers.make(plan.sampler, env, agent.act, config.num_steps, device=plan.device,   # its checks
                            agent=(plan.name, config), workers=plan.sampler_workers)        # before the folder
    try:
        with world.agree():
            run_dir = prepare_run_dir(plan.log_dir, plan.name, config, plan.seed, resumed) if world.main else None
    except BaseException:
        sampler.close()
        raise
    if world.main:
        write_config_json(run_dir, plan.name, plan.seed, plan.run_config, plan.preset,
                          **({"num_seeds": plan.num_seeds, "sweep": plan.sweep} if rows else {}))
    state, counters = initial_state(plan, world, agent)
    learner = ReplayLearner(plan, agent, env.spec, fused, world.size == 1) if plan.off_policy else None
    evaluation = run_evaluation(plan, world, counters["env_steps"], run_dir)
    keeps_envs = world.size == 1 and hasattr(sampler, "state_dict")   # the graph sampler's tensors, in-process envs
    if keeps_envs and resumed and plan.ckpt.get("sampler_state") is not None:
        sampler.load_state_dict(plan.ckpt["sampler_state"])
    progress = run_progress(plan, world, run_dir, counters)
    threads = update_threads(plan, world, env)
    steps_per_collect = config.num_steps * config.num_envs
    log, save = cadences(plan, steps_per_collect, counters["env_steps"])
    last_checkpoint = run_dir / CHECKPOINT if world.main else "on rank 0"
    callbacks = run_callbacks(plan, world, run_dir)

    def check_finite() -> dict:   # the mean over ranks, so that every rank stops together
        scalars = world.mean(scalar_metrics(metrics))
        bad = non_finite_losses(scalars, metrics if rows else None)
        raise_if_loss_not_finite(bad, counters["env_steps"] * world.size, last_checkpoint)
        return scalars

    def checkpoint() -> None:
        if world.main:
            save_checkpoint(run_dir / CHECKPOINT, checkpoint_payload(
                algo=plan.name, seed=plan.seed, config=dataclasses.asdict(plan.run_config), state=state,
                counters=counters, world_size=world.size, preset=plan.preset, sampler=plan.sampler,
                sampler_state=sampler.state_dict() if keeps_envs else None, episodes=progress.stats.state_dict(),
                **(learner.checkpoint_entries(world.size == 1) if learner else {}),
                **({"num_seeds": plan.num_seeds, "sweep": plan.sweep} if rows else {})))

    metrics, solved, updates_here = {}, False, 0   # updates_here: in this process (warm after two)
    steady = compiled.HeldStance()
    with StopRequest(escalate=world.size == 1) as stop:
        try:
            while counters["env_steps"] < config.total_steps:
                steady.hold(updates_here >= 2 and guards_skipped(plan))
                rollout = sampler.collect(state)
                counters["env_steps"] += steps_per_collect
                state["env_steps"].add_(steps_per_collect)   # in place, as `+=` is, without the TensorDict's set
                progress.add(rollout)
                if learner is not None:
                    learner.add(rollout)
                with intra_op_threads(threads):
                    if learner is None:
                        (state, metrics), n = agent.update(state, rollout), 1
                    else:
                        state, latest, n = learner.learn(state, counters["env_steps"], steps_per_collect)
                        metrics = latest if n else metrics
                counters["updates"] += n
                updates_here += n
                progress.advance(steps_per_collect)
                done = counters["env_steps"] >= config.total_steps
                if log.due(counters["env_steps"]) or done:
                    steady.release()
                    log.passed(counters["env_steps"])
                    scalars = check_finite()
                    solved = progress.close_interval(counters, plan.stop_return)
                    evaluations = evaluation(state, counters["env_steps"], solved or done) if evaluation else None
                    logged = progress.write(counters, evaluations, _metric_rows(plan, metrics, scalars),
                                            extra={"tier": tier_of(plan, agent)})
                    solved = callbacks.logged(counters["env_steps"] * world.size, logged, state) or solved
                stopping = _stop_agreed(stop, world)
                if solved or done or save.due(counters["env_steps"]) or stopping:
                    steady.release()
                    save.passed(counters["env_steps"])
                    check_finite()
                    checkpoint()
                    callbacks.checkpointed(counters["env_steps"] * world.size, last_checkpoint, state)
                if solved:
                    break
                if stopping:   # SIGTERM / SIGINT: stopped here, with the checkpoint just written
                    raise stop.stopped(run_dir, counters["env_steps"] * world.size, signum=stopping)
            if plan.plot and world.main:   # before the logger closes: a tracker takes the curve too
                progress.logger.plot(title=_title(plan))
        except SamplerError as e:   # a parallel worker died or failed (during a stop: the stop's exit)
            failure, steps = stopped_by(e, counters["env_steps"], last_checkpoint), counters["env_steps"]
            raise stop.or_failure(failure, checkpoint, run_dir, steps, alone=world.size == 1) from None
        finally:
            steady.release()
            progress.close()
            sampler.close()
            close_agent(agent)
            release_run_dir(run_dir)
            if evaluation is not None:
                evaluation.close()
    return TrainResult(state=state, return_mean=mean_of_rows(progress.stats.means()), history=progress.logger.rows,
                       log_dir=run_dir, eval_returns=evaluation.returns if evaluation is not None else None)


def _stop_agreed(stop: StopRequest, world) -> int:
    """The signal (0: none) that reached this process or any rank (one all-reduce): all stop together."""
    return (stop.signum or 0) if world.size == 1 else int(world.max([float(stop.signum or 0)])[0])


def _metric_rows(plan, metrics, scalars: dict) -> list[dict]:
    """The update's metrics of each row, for progress.csv (per-sample priorities left out)."""
    if plan.rows:
        from fnrl import seeds as vmapped

        return vmapped.metric_rows(metrics, plan.width)
    return [{k: v for k, v in scalars.items() if k != "priority"}]


def _title(plan) -> str:
    seeds = f"seeds {plan.seed}-{plan.seed + plan.num_seeds - 1}" if plan.num_seeds > 1 else f"seed {plan.seed}"
    return f"{plan.name} {plan.config.env_id} {seeds}" + (f", sweep {', '.join(plan.sweep)}" if plan.sweep else "")
