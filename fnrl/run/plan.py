"""One run, resolved and checked before any work: `make_plan(world, name, config, **options)`.

A plan holds the algorithm module, the config this process trains (a rank's share of the
budget) beside the one the user asked for, the vmapped rows, the sampler, the runtime that
will run it (the serial loop, `--sampler async`'s learner, or an algorithm's actor processes)
and the run options. Every check of an option against the algorithm, the others and the
machine is here, so a bad combination is one `ConfigError` line before anything is built.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

import torch

from fnrl import algos, samplers
from fnrl.accel.cudagraphs import check_cuda_graphs
from fnrl.run.callbacks import check_callbacks
from fnrl.run.tracking import check_tracker
from fnrl.accel.options import AccelOptions, resolve
from fnrl.errors import ConfigError
from fnrl.run.checkpoint import config_from_json, load_checkpoint
from fnrl.run.folder import check_log_dir


@dataclass
class Plan:
    """A resolved run (see `make_plan`; the options are `fnrl.train.train`'s)."""

    name: str
    module: ModuleType
    config: object
    """what this process trains: for a data-parallel run, its share of `total_steps`"""
    run_config: object
    """as asked: saved in config.json and checkpoints"""
    seed: int
    device: str
    runtime: str
    """"serial", "async" (off-policy sampling in its own process) or "central" (IMPALA's actors)"""
    sampler: str
    rows: list | None = None
    """the vmapped rows (`fnrl.seeds.Row`) of a --num-seeds / --sweep run; None for one seed"""
    num_seeds: int = 1
    sweep: dict | None = None
    preset: str | None = None
    ckpt: dict | None = None
    """the checkpoint a resumed run continues from"""
    resume: object = None
    log_dir: object = None
    compile: bool = True
    tiered: bool = False
    """compile="tiered": eager steps until the compiled ones are built (`fnrl.accel.tiered`)"""
    quiet: bool = False
    log_interval: int | None = None
    checkpoint_every: int | None = None
    threads: int | None = 1
    update_threads: int | None = None
    tensorboard: bool = True
    plot: bool = True
    stop_return: float | None = None
    eval_interval: int | None = None
    eval_episodes: int = 10
    capture_video: bool = False
    track: str | None = None
    """--track: wandb or mlflow (`fnrl.run.tracking`)"""
    sampler_workers: int | None = None
    actor_hosts: int = 0
    """--actor-hosts: actor hosts feeding the async learner, or env hosts of a central runtime (their
    actors), over torch.distributed; 0: this machine's processes"""
    cuda_graphs: bool = False
    accel: AccelOptions = dataclasses.field(default_factory=AccelOptions)
    """how compiled steps run (`fnrl.accel.AccelOptions`)"""
    callbacks: list = dataclasses.field(default_factory=list)
    """the user's callbacks (`fnrl.run.callbacks`)"""

    @property
    def off_policy(self) -> bool:
        return self.module.SPEC.off_policy

    @property
    def width(self) -> int:
        """The independent rows trained side by side (1 without --num-seeds / --sweep)."""
        return len(self.rows) if self.rows else 1

    @property
    def sequence_replay(self) -> bool:
        return self.module.SPEC.replay == "sequence"


def resumed_config(ckpt: dict, name: str, resume, world_size: int):
    """The config of checkpoint `ckpt` (read from `resume`), after checking that algorithm `name`
    with `world_size` processes can continue it."""
    if ckpt.get("world_size", 1) != world_size:
        raise ConfigError(f"checkpoint {resume} was written by {ckpt.get('world_size', 1)} processes; resume it "
                          f"with --nproc {ckpt.get('world_size', 1)}, not {world_size}")
    if ckpt["algo"] != name:
        raise ConfigError(f"checkpoint {resume} is from {ckpt['algo']}, not {name}; "
                          f"run `fnrl train {ckpt['algo']} --resume {resume}`")
    return type(algos.default_config(name))(**config_from_json(ckpt["config"]))


def _changed(config, changes: dict, ckpt: dict, resume):
    """The resumed `config` with `changes` (Config fields given again): ConfigError naming every field
    whose value differs from the checkpoint's, but `total_steps`, which extends the run when it is
    more than the env steps the run has made."""
    differ = sorted(k for k, v in changes.items() if k != "total_steps" and getattr(config, k, v) != v)
    if differ:
        raise ConfigError(f"--resume continues a run with its checkpoint's config; only --total-steps may change "
                          f"(to extend the run), not {', '.join('--' + k.replace('_', '-') for k in differ)}")
    total_steps = changes.get("total_steps", config.total_steps)
    if total_steps == config.total_steps:
        return config
    done = ckpt["counters"]["env_steps"] * ckpt.get("world_size", 1)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= done:
        raise ConfigError(f"run {resume} stands at {done} env steps; --total-steps must be more than that to "
                          f"extend it, got {total_steps!r}")
    return dataclasses.replace(config, total_steps=total_steps)


def make_plan(world, name: str, config=None, *, seed: int = 0, log_dir=None, device: str = "cpu",
              resume=None, sampler: str | None = None, num_seeds: int = 1, sweep: dict | None = None,
              preset: str | None = None, changes: dict | None = None, **options) -> Plan:
    """Resolve and check one process's run (of `world`, a fnrl.distributed World); `options` are
    the rest of `fnrl.train.train`'s keywords, kept as they are. A resumed run takes its config,
    seed, rows, sampler and preset from its checkpoint."""
    module = algos.load(name)
    options["accel"] = resolve(options.get("accel"))
    compile = options.get("compile", True)
    if compile not in (True, False, "tiered"):
        raise ConfigError(f"compile must be True, False or 'tiered', got {compile!r}")
    options["compile"], options["tiered"] = bool(compile), compile == "tiered"
    ckpt = None
    if resume is not None:
        with world.agree():
            ckpt = load_checkpoint(resume) if world.main else None
        ckpt = world.broadcast_object(ckpt)
        config = resumed_config(ckpt, name, resume, world.size)
        log_dir, seed = resume, ckpt["seed"]
        num_seeds, sweep = ckpt.get("num_seeds", 1), ckpt.get("sweep")
        sampler = sampler or ckpt.get("sampler", "serial")
        preset = ckpt.get("preset")
        config = _changed(config, changes or {}, ckpt, resume)
    elif changes:
        raise ConfigError("changes= applies to a resumed run; a new run takes its settings in its config")
    sampler = sampler or "serial"
    if config is None:
        from fnrl.presets import configure

        config, preset = configure(name)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but no CUDA device is available; use --device cpu")
    module.validate(config)
    runtime = "async" if sampler == "async" else module.SPEC.runtime
    rows = None
    if num_seeds != 1 or sweep:
        from fnrl import seeds as vmapped

        rows = vmapped.make_rows(module, config, seed, num_seeds, sweep)
        sweep = {vmapped.ALIASES.get(k, k): [float(v) for v in vs] for k, vs in sweep.items()} if sweep else None
    plan = Plan(name=name, module=module, config=config, run_config=config, seed=seed, device=device,
                runtime=runtime, sampler=sampler, rows=rows, num_seeds=num_seeds, sweep=sweep, preset=preset,
                ckpt=ckpt, resume=resume, log_dir=log_dir, **options)
    _check(plan, world)
    if plan.actor_hosts and runtime == "central":   # the hosts are the actors
        plan.config = plan.run_config = dataclasses.replace(config, num_actors=plan.actor_hosts)
    plan.device = world.device(device)
    if world.size > 1:   # a rank runs its share of total_steps
        plan.config = dataclasses.replace(config, total_steps=-(-config.total_steps // world.size))
    return plan


def _check(plan: Plan, world) -> None:
    """Every combination check of the run's options, one ConfigError line each."""
    name, sampler, rows = plan.name, plan.sampler, plan.rows
    plan.callbacks = check_callbacks(plan.callbacks, world.size)
    check_tracker(plan.track)
    check_cuda_graphs(plan.cuda_graphs, device=plan.device, compile=plan.compile, algo=name,
                      off_policy=plan.off_policy, sampler=sampler, central=plan.runtime == "central",
                      single=None if not rows else False)
    if rows and sampler not in ("serial", "graph"):
        raise ConfigError("--num-seeds / --sweep train with the serial sampler (or the graph sampler); drop "
                          "--sampler, or run the seeds separately")
    eval_episodes, eval_interval = plan.eval_episodes, plan.eval_interval
    if not isinstance(eval_episodes, int) or eval_episodes < 0:
        raise ConfigError(f"--eval-episodes must be >= 0 (0 turns the final evaluation off), got {eval_episodes!r}")
    if plan.capture_video and not eval_episodes:
        raise ConfigError("--capture-video records the evaluations' episodes; give --eval-episodes >= 1")
    if eval_interval is not None and (not isinstance(eval_interval, int) or eval_interval < 1 or not eval_episodes):
        raise ConfigError(f"--eval-interval must be a positive number of env steps, with --eval-episodes >= 1; got "
                          f"{eval_interval!r} and {eval_episodes!r}")
    if world.size > 1 and (rows or sampler != "serial"):
        raise ConfigError("data-parallel runs (--nproc / torchrun) use the serial sampler and one seed per "
                          "process; drop --sampler / --num-seeds / --sweep")
    if sampler == "async":
        from fnrl.train_async import check_async

        check_async(name, plan.module, plan.config)
    hosts = plan.actor_hosts
    hosted = sampler == "async" or (plan.runtime == "central" and sampler == "serial")
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 0 or (hosts and not hosted):
        raise ConfigError(f"--actor-hosts N (N >= 1) runs the actors of --sampler async (off-policy) or of impala as "
                          f"N hosts over torch.distributed; got {hosts!r} with {name} and --sampler {sampler}")
    if hosts and plan.runtime == "central" and hosts > plan.config.queue_size:
        raise ConfigError(f"--actor-hosts {hosts} needs --queue-size {hosts} or more (a trajectory slot per host); "
                          f"got {plan.config.queue_size}")
    if sampler != "async":
        samplers.load(sampler)   # an unknown name: one line listing the choices
    if sampler == "graph":
        from fnrl.samplers.graph import check_supported

        check_supported(name, plan.module)
        if getattr(plan.config, "env_kwargs", None):
            raise ConfigError("--sampler graph steps fnrl's own torch version of the env, which takes no "
                              "--env-kwargs; drop one of the two")
    if plan.threads is not None and (isinstance(plan.threads, bool) or not isinstance(plan.threads, int)
                                     or plan.threads < 1):
        raise ConfigError(f"--threads must be at least 1 (or left out for torch's default), got {plan.threads!r}")
    if plan.log_dir is not None and world.main:
        check_log_dir(plan.log_dir)
    if plan.update_threads is not None and plan.update_threads < 1:
        raise ConfigError(f"--update-threads must be at least 1, got {plan.update_threads}")
    if plan.update_threads is not None and plan.runtime != "serial":
        raise ConfigError(f"--update-threads applies to the serial training loop, not to {name}'s {plan.runtime} "
                          "one; drop it (--threads sets the learner's threads there)")
    if plan.runtime == "central" and (rows or world.size > 1 or sampler != "serial"):
        raise ConfigError(f"{name} runs its own actor processes: drop --sampler, --nproc, --num-seeds and "
                          "--sweep (run its seeds as separate runs)")
    if plan.runtime == "async":
        from fnrl.train_async import check_async

        check_async(name, plan.module, plan.config)
