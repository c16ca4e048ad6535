"""The `fnrl` command: train, eval, export, check-env, launch, plot, bench.

    fnrl train ALGO [--env ENV_ID] [--preset auto|none] [--total-steps N] [--seed S] [--log-dir DIR]
                    [--device cpu|cuda [--cuda-graphs]] [--compile/--no-compile] [--resume DIR]
                    [--stop-return R] [--eval-episodes K] [--eval-interval N] [--capture-video]
                    [--track wandb|mlflow]
                    [--sampler serial|alternating|parallel|graph|async [--sampler-workers W] [--actor-hosts N]]
                    [--nproc N]
                    [--num-seeds K] [--sweep FIELD=V1,V2,...] [--FIELD V ...]
    fnrl eval CHECKPOINT|POLICY [--episodes N] [--record-video PATH.mp4|PATH.gif] [--row K]
    fnrl export RUN [--format policy|pt2|onnx] [--out FILE] [--row K]
    fnrl check-env ENV_ID [--env-kwargs JSON] [--steps N]
    fnrl launch GRID_FILE [--slots N] [--dry-run]
    fnrl plot DIR... [--out curves.png] [--y return_mean] [--group-by config|none] [--band minmax|std]
    fnrl bench [--quick] [--only KEY,...] [--threads N] [--device cpu|cuda]   (from a source checkout)

Every field of the algorithm's Config is an option of its own, spelled as in CleanRL
(`--num-envs 64`, `--learning-rate 3e-4`); an env with a tuned preset (`fnrl.presets`) starts
from it, and the options given override it. Bad input stops with one line on stderr and
exit code 2, before any training.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from fnrl.errors import ConfigError
from fnrl.presets import CHOICES, configure, describe

_RUN_OPTIONS = ("seed", "log_dir", "device", "compile", "resume", "threads", "update_threads", "env_threads",
                "quiet", "stop_return", "eval_interval", "eval_episodes", "capture_video", "track", "sampler",
                "num_seeds", "sweep", "nproc", "sampler_workers", "actor_hosts", "cuda_graphs")


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors in one line (and exit code 2)."""

    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_fields(parser: argparse.ArgumentParser, config) -> None:
    """An option per Config field; only the options given end up in the parsed namespace (the
    rest come from the preset or the Config's defaults)."""
    hints = typing.get_type_hints(type(config))
    docs = _field_docs(type(config))
    for f in dataclasses.fields(config):
        default = getattr(config, f.name)
        kind = hints[f.name]
        help_text = f"{docs.get(f.name, '')} (default: {default}, unless a preset sets it)"
        names = [_option(f.name)] + (["--env"] if f.name == "env_id" else [])
        given_only = argparse.SUPPRESS
        if kind is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=given_only,
                                help=help_text)
        elif kind is dict:
            parser.add_argument(*names, dest=f.name, type=_json_object, default=given_only, help=help_text,
                                metavar="JSON")
        elif typing.get_origin(kind) is tuple:
            inner = typing.get_args(kind)[0]
            parser.add_argument(*names, dest=f.name, type=inner, nargs="+", default=given_only, help=help_text,
                                metavar="V")
        else:
            base = [a for a in typing.get_args(kind) if a is not type(None)]
            parser.add_argument(*names, dest=f.name, type=base[0] if base else kind, default=given_only,
                                help=help_text, metavar=f.name.upper())


def _json_object(text: str) -> dict:
    """A JSON object given on the command line (e.g. `--env-kwargs '{"max_episode_steps": 200}'`)."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({e.msg}); give an object such as "
                                         "'{\"max_episode_steps\": 200}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object; give one such as "
                                         "'{\"max_episode_steps\": 200}'")
    return value


def _field_docs(cls) -> dict:
    """Docstrings written under each dataclass field (the tyro / CleanRL convention)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body, docs = tree.body[0].body, {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None),
                                                                                 ast.Constant):
            docs[a.target.id] = str(b.value.value).strip()
    return docs


def _train(argv: list[str]) -> int:
    from fnrl import algos

    if not argv or argv[0].startswith("-"):
        if argv and argv[0] in ("-h", "--help"):
            print(f"usage: fnrl train ALGO [options]; ALGO is one of {', '.join(algos.available())}")
            return 0
        raise ConfigError(f"fnrl train needs an algorithm: one of {', '.join(algos.available())}")
    name = argv[0]
    config = algos.default_config(name)
    parser = _OneLineParser(prog=f"fnrl train {name}", description=f"Train {name}.", allow_abbrev=False)
    _add_config_fields(parser, config)
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--log-dir", default=None, help="the run's folder (default: runs/ALGO-ENV-sSEED-TIME)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the networks run")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="--compile: compile the update and acting steps before the first one; --no-compile: "
                             "run them eagerly (default: tiered: one feed-forward seed on the CPU trains on the eager "
                             "steps at once and switches to the compiled ones when a background process has built "
                             "them; other runs compile first)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=False,
                        help="replay steps from CUDA graphs: the off-policy learner step; PPO's / A2C's update "
                             "and acting step (needs --device cuda; default: off)")
    parser.add_argument("--resume", default=None, metavar="DIR", help="continue the run in DIR from its checkpoint")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--update-threads", type=int, default=None, metavar="N",
                        help="torch intra-op threads while updating (default: every core for on-policy "
                             "minibatches of >= 2048 rows or of images, else --threads)")
    parser.add_argument("--env-threads", type=int, default=None, metavar="N",
                        help="EnvPool threads per env pool, 0 for one per core (default: 1 for classic-control "
                             "tasks, whose steps cost less than a thread hand-off; one per core otherwise)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--preset", default="auto", choices=CHOICES,
                        help="auto: start from the tuned settings of this algorithm and env where fnrl has them "
                             "(fnrl/presets); none: the Config defaults (default: auto)")
    parser.add_argument("--stop-return", type=float, default=None, metavar="R",
                        help="stop early once the mean return of the last 100 episodes reaches R, after at least "
                             "20 episodes (of every seed) (default: never)")
    parser.add_argument("--eval-episodes", type=int, default=10, metavar="K",
                        help="the final evaluation: K episodes of every seed's policy without exploration on "
                             "separate envs, logged as eval_return_mean; 0 turns it off (default: 10)")
    parser.add_argument("--eval-interval", type=int, default=None, metavar="N",
                        help="also evaluate every N env steps (default: only at the end)")
    parser.add_argument("--capture-video", action="store_true",
                        help="record the first episode of every evaluation to RUN/videos/ (H.264 mp4 with "
                             "pip install \"fnrl[video]\", else gif)")
    parser.add_argument("--track", default=None, choices=["wandb", "mlflow"],
                        help="also log the progress rows, config and videos to W&B or MLflow, configured by their "
                             "own environment variables (pip install \"fnrl[wandb]\" / \"fnrl[mlflow]\")")
    parser.add_argument("--sampler", default=None, metavar="NAME",
                        help="how rollouts are collected: serial, alternating (two EnvPool groups overlapping the "
                             "policy), parallel (worker processes), graph (CartPole-v1, Acrobot-v1, Pendulum-v1, "
                             "MountainCar-v0, MountainCarContinuous-v0 or fnrl/CartPoleNoVel-v1: the env's dynamics "
                             "in torch, compiled with the policy into one call per rollout) or async (off-policy: "
                             "sampling in its own process writing a shared replay) (default: serial; with --resume, the "
                             "run's own)")
    parser.add_argument("--sampler-workers", type=int, default=None, metavar="W",
                        help="worker processes of --sampler parallel (default: one per core, dividing --num-envs)")
    parser.add_argument("--actor-hosts", type=int, default=0, metavar="N",
                        help="with --sampler async: N actor hosts (local processes, or ranks 1..N under torchrun) "
                             "send rollouts to the learner's replay over torch.distributed and get parameters back "
                             "(Ape-X); with impala: N env hosts send observations and get actions from the "
                             "learner's batched inference (SEED RL)")
    parser.add_argument("--num-seeds", type=int, default=1, metavar="K",
                        help="train seeds SEED..SEED+K-1 at once in one process, vmapped (default: 1)")
    parser.add_argument("--sweep", default=None, metavar="FIELD=V1,V2,...",
                        help="also train each value of one numeric Config field at once, vmapped "
                             "(e.g. learning_rate=1e-4,3e-4,1e-3)")
    parser.add_argument("--nproc", type=int, default=None, metavar="N",
                        help="data-parallel processes on this machine, gradients averaged (fnrl.distributed); "
                             "--total-steps is the whole run's (default: 1; under torchrun leave it out)")
    args = vars(parser.parse_args(argv[1:]))
    if args["sweep"] is not None:
        from fnrl.seeds import parse_sweep

        args["sweep"] = parse_sweep(args["sweep"])
    run = {k: args.pop(k) for k in _RUN_OPTIONS}
    run["compile"] = "tiered" if run["compile"] is None else run["compile"]
    choice = args.pop("preset")
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
    config = preset = None
    if run["resume"] is not None:   # a resumed run continues with its checkpoint's config
        run["changes"] = given or None
    else:
        config, preset = configure(name, preset=choice, **given)
        if preset is not None and _rank() == 0:
            print(f"fnrl: {describe(preset)}")

    from fnrl.train import train

    result = train(name, config, preset=preset, **run)
    if result.log_dir is None:   # a non-zero rank of a torchrun launch: rank 0 reports
        return 0
    print(f"done: {result.history[-1]['env_steps'] if result.history else 0} env steps, return_mean "
          f"{result.return_mean:.2f} (last 100 episodes){_evaluation_text(result.eval_returns)}; "
          f"outputs in {result.log_dir}")
    return 0


def _evaluation_text(returns: list[list[float]] | None) -> str:
    """"; final evaluation M (K episodes, no exploration)", with each row's mean for several rows."""
    if not returns:
        return ""
    means = [sum(r) / len(r) for r in returns]
    text = f"; final evaluation {sum(means) / len(means):.2f} ({len(returns[0])} episodes"
    if len(means) > 1:
        text += f" per seed, no exploration; per seed {', '.join(f'{m:.1f}' for m in means)})"
    return text + ("" if len(means) > 1 else ", no exploration)")


def _eval(argv: list[str]) -> int:
    parser = _OneLineParser(prog="fnrl eval", description="Evaluate a checkpoint without exploration.")
    parser.add_argument("checkpoint", help="checkpoint.pt or the run folder holding it")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=10_000)
    parser.add_argument("--record-video", default=None, metavar="PATH",
                        help="write env 0's first episode(s) to PATH (.mp4, or .gif) (default: no video)")
    parser.add_argument("--record-episodes", type=int, default=1, metavar="K",
                        help="episodes of env 0 in the video (default: 1)")
    parser.add_argument("--fps", type=float, default=30.0, help="video frames per second (default: 30)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--row", type=int, default=None, metavar="K",
                        help="row K of a vmapped run (--num-seeds / --sweep), in progress.csv's order")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.threads < 1:
        raise ConfigError("--episodes and --threads must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    from fnrl.evaluate import evaluate_checkpoint, summarize

    name, returns = evaluate_checkpoint(args.checkpoint, args.episodes, args.seed, record_video=args.record_video,
                                        record_episodes=args.record_episodes, fps=args.fps, row=args.row)
    print(f"{name}: {summarize(returns)}" + (f"; video in {args.record_video}" if args.record_video else ""))
    return 0


def _launch(argv: list[str]) -> int:
    """fnrl launch GRID_FILE [--slots N] [--dry-run]"""
    parser = _OneLineParser(prog="fnrl launch", description="Run a grid of training runs as a queue "
                            "(a .py file defining GRID, or .yaml; see fnrl.launch). Finished runs are "
                            "skipped, interrupted ones resumed.")
    parser.add_argument("grid", help="grid file, e.g. experiments/grid_cartpole.py")
    parser.add_argument("--slots", type=int, default=1, help="runs at once, each on its share of the cores "
                        "(default: 1)")
    parser.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args(argv)
    from fnrl.launch import launch, summary

    outcomes = launch(args.grid, slots=args.slots, dry_run=args.dry_run)
    print(f"launch: {summary(outcomes)}")
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def _plot(argv: list[str]) -> int:
    """fnrl plot DIR... [--out curves.png] [--y return_mean] [--group-by config|none] [--band minmax|std]"""
    parser = _OneLineParser(prog="fnrl plot", description="Learning curves of the runs under DIRs, grouped by "
                            "config (equal config.json except the seed): mean and spread over seeds.")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run folders or folders holding runs")
    parser.add_argument("--out", default="curves.png", help="figure file (default: curves.png)")
    parser.add_argument("--y", default="return_mean", help="progress.csv column to plot (default: return_mean)")
    parser.add_argument("--group-by", default="config", choices=["config", "none"],
                        help="config: one curve per config over its seeds; none: one per run (default: config)")
    parser.add_argument("--band", default="minmax", choices=["minmax", "std"],
                        help="spread over seeds: min-max or mean +- std (default: minmax)")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    from fnrl.plot import plot_runs

    groups = plot_runs(args.dirs, args.out, y=args.y, group_by=args.group_by, band=args.band, title=args.title)
    for label, runs in groups.items():
        print(f"{label}: {len(runs)} run(s)")
    print(f"plot: {args.out}")
    return 0


def _bench(argv: list[str]) -> int:
    """Run benchmarks/suite.py of the source checkout fnrl is installed from."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "suite.py"
    if not path.exists():
        raise ConfigError(f"fnrl bench runs the suite in the repository's benchmarks/ folder, but {path} does not "
                          "exist; install fnrl from a source checkout (pip install -e .)")
    spec = importlib.util.spec_from_file_location("fnrl_benchmark_suite", path)
    suite = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = suite  # dataclasses look their module up by name
    spec.loader.exec_module(suite)
    try:
        return suite.main(argv)
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _export(argv: list[str]) -> int:
    from fnrl.export import FORMATS

    parser = _OneLineParser(prog="fnrl export", description="Write a trained agent's policy: fnrl's policy file "
                            "(what acting needs, for `fnrl eval` or sharing), or the deterministic policy as a "
                            "program that runs without fnrl (torch.export's pt2, or ONNX).")
    parser.add_argument("run", help="the run folder, or its checkpoint.pt")
    parser.add_argument("--format", default="policy", choices=list(FORMATS),
                        help="policy: fnrl's policy file; pt2: torch.export.load(FILE).module()(obs) -> action; "
                             "onnx: the same program for onnxruntime (default: policy)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="where to write it (default: RUN/policy.pt, .pt2 or .onnx)")
    parser.add_argument("--row", type=int, default=None, metavar="K",
                        help="pt2 / onnx of a vmapped run (--num-seeds / --sweep): the row to export")
    args = parser.parse_args(argv)
    from fnrl.export import export_policy

    print(f"policy written to {export_policy(args.run, args.out, format=args.format, row=args.row)}")
    return 0


def _check_env(argv: list[str]) -> int:
    parser = _OneLineParser(prog="fnrl check-env", description="Check that an env meets what fnrl's training loops "
                            "rely on (spaces, dtypes, the reset / step contract, finite values, episode ends, "
                            "determinism under a seed); exit code 1 if a check fails.")
    parser.add_argument("env", metavar="ENV_ID", help="an EnvPool task, a gymnasium id, or gymnasium's module:Env-v0")
    parser.add_argument("--env-kwargs", type=_json_object, default={}, metavar="JSON",
                        help="keyword arguments of the env's constructor")
    parser.add_argument("--steps", type=int, default=500, help="random-action steps of 2 envs (default: 500)")
    parser.add_argument("--seed", type=int, default=0, help="the envs' seeds and the actions' (default: 0)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {args.steps}")
    from fnrl.envs.check import check_env, report

    checks = check_env(args.env, args.env_kwargs, steps=args.steps, seed=args.seed)
    print(report(checks))
    return 0 if all(c.ok for c in checks) else 1


COMMANDS = {"train": _train, "eval": _eval, "export": _export, "check-env": _check_env, "launch": _launch,
            "plot": _plot, "bench": _bench}


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def _working_directory_importable() -> None:
    """The working directory on sys.path, as `python -m fnrl` has it, so that the `fnrl` command
    also finds a user's modules beside it (`--env mypkg.envs:Env-v0`, `--conv mypkg.nets:torso`),
    and so do the worker processes it starts. Appended: it shadows no installed package."""
    import os

    try:
        cwd = os.getcwd()
    except FileNotFoundError:   # a working directory that was deleted: nothing to find there
        return
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def command_line() -> int:
    """The `fnrl` command (and `python -m fnrl`): `main()` on the process's arguments, its exit
    status returned for `sys.exit`. Before it returns, every object left is moved out of the
    garbage collector's reach (`gc.freeze`): the interpreter's last collections at exit would
    otherwise walk all of torch's objects (`docs/decisions.md`). Whatever the command opened is
    closed by then; callers of `main` in a process that goes on are not affected."""
    import gc

    code = main()
    gc.collect()   # what is garbage now is still finalized
    gc.freeze()
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _working_directory_importable()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    command = COMMANDS.get(argv[0])
    try:
        if command is None:
            raise ConfigError(f"unknown command {argv[0]!r}; use one of: {', '.join(COMMANDS)}")
        return command(argv[1:])
    except ConfigError as e:
        if _rank() == 0:   # under torchrun every rank stops with the same error: say it once
            print(f"fnrl: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from fnrl.train import TrainingError

        if not isinstance(e, TrainingError):
            raise
        if _rank() == 0:
            print(f"fnrl: training stopped: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        from fnrl.run.stop import RunStopped

        if isinstance(e, RunStopped):   # the loop stopped at a boundary and wrote its checkpoint
            if _rank() == 0:   # under torchrun every rank stops at the same step: say it once
                print(f"fnrl: {e}", file=sys.stderr)
            return 128 + e.signum
        print("fnrl: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
