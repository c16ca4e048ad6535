"""The `fnrl` command: train, eval.

    fnrl train ALGO [--env ENV_ID] [--total-steps N] [--seed S] [--log-dir DIR]
                    [--device cpu|cuda] [--compile/--no-compile] [--resume DIR]
                    [--stop-return R] [--sampler NAME] [--sampler-workers W] [--FIELD V ...]
    fnrl eval CHECKPOINT [--episodes N]

Every field of the algorithm's Config is an option of its own, spelled as in CleanRL
(`--num-envs 64`, `--learning-rate 3e-4`). Bad input stops with one line on stderr and
exit code 2, before any training.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing

from fnrl.errors import ConfigError

_RUN_OPTIONS = ("seed", "log_dir", "device", "compile", "resume", "threads", "quiet", "stop_return", "sampler",
                "sampler_workers")


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports errors in one line (and exit code 2)."""

    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_config_fields(parser: argparse.ArgumentParser, config) -> None:
    hints = typing.get_type_hints(type(config))
    docs = _field_docs(type(config))
    for f in dataclasses.fields(config):
        default = getattr(config, f.name)
        kind = hints[f.name]
        help_text = f"{docs.get(f.name, '')} (default: {default})"
        names = [_option(f.name)] + (["--env"] if f.name == "env_id" else [])
        if kind is bool:
            parser.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
        elif typing.get_origin(kind) is tuple:
            inner = typing.get_args(kind)[0]
            parser.add_argument(*names, dest=f.name, type=inner, nargs="+", default=default, help=help_text,
                                metavar="V")
        else:
            base = [a for a in typing.get_args(kind) if a is not type(None)]
            parser.add_argument(*names, dest=f.name, type=base[0] if base else kind, default=default,
                                help=help_text, metavar=f.name.upper())


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
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="torch.compile the update and acting steps (default: on)")
    parser.add_argument("--resume", default=None, metavar="DIR", help="continue the run in DIR from its checkpoint")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default: 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--stop-return", type=float, default=None, metavar="R",
                        help="stop early once a log interval's mean episode return reaches R (default: never)")
    parser.add_argument("--sampler", default="serial", metavar="NAME",
                        help="how rollouts are collected: serial, alternating (two EnvPool groups overlapping the "
                             "policy) or parallel (worker processes) (default: serial)")
    parser.add_argument("--sampler-workers", type=int, default=None, metavar="W",
                        help="worker processes of --sampler parallel (default: one per core, dividing --num-envs)")
    args = vars(parser.parse_args(argv[1:]))
    run = {k: args.pop(k) for k in _RUN_OPTIONS}
    config = dataclasses.replace(config, **{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})

    from fnrl.train import train

    result = train(name, config if run["resume"] is None else None, **run)
    print(f"done: {result.history[-1]['env_steps'] if result.history else 0} env steps, "
          f"return_mean {result.return_mean:.2f}; outputs in {result.log_dir}")
    return 0


def _eval(argv: list[str]) -> int:
    parser = _OneLineParser(prog="fnrl eval", description="Evaluate a checkpoint without exploration.")
    parser.add_argument("checkpoint", help="checkpoint.pt or the run folder holding it")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise ConfigError("--episodes must be at least 1")
    from fnrl.evaluate import evaluate_checkpoint, summarize

    name, returns = evaluate_checkpoint(args.checkpoint, args.episodes, args.seed)
    print(f"{name}: {summarize(returns)}")
    return 0


COMMANDS = {"train": _train, "eval": _eval}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    command = COMMANDS.get(argv[0])
    try:
        if command is None:
            raise ConfigError(f"unknown command {argv[0]!r}; use one of: {', '.join(COMMANDS)}")
        return command(argv[1:])
    except ConfigError as e:
        print(f"fnrl: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from fnrl.train import TrainingError

        if not isinstance(e, TrainingError):
            raise
        print(f"fnrl: training stopped: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fnrl: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
