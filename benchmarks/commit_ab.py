"""PPO CartPole training iterations of this tree against an earlier commit, in alternating processes.

For a change that touches both acting and the update (so no single process can hold the old
and the new code), this script checks out `--base` into a temporary git worktree and runs the
same measurement in child processes that import fnrl from one tree or the other, alternating
base, head, base, head, ... (`--pairs` times), so a drift in the host's speed hits both alike.

Each child builds what `fnrl train ppo` builds for the settings (compiled update, AOTInductor
act, the serial sampler over EnvPool with the loop's update threads and, where the tree has it,
its polling rule; with `--eager`, what `fnrl train ppo --no-compile` builds: the eager update and
act), runs 3 warm-up iterations (collect + update), then times 20 and prints the median collect
and update milliseconds. Settings: `default` (`fnrl train ppo`: 8 envs x 32, 20
epochs x 1 minibatch), `cleanrl` (4 envs x 128, 4 x 4) or `purejaxrl` (64 envs x 128, 4 x 4).
Writes benchmarks/commit_ab.md (or --out; new runs on top).

    python benchmarks/commit_ab.py --base 500d218 [--settings default,purejaxrl] [--pairs 3] [--eager]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = Path(__file__).with_suffix(".md")
SETTINGS = {
    "default": {},
    "cleanrl": dict(num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4),
    "purejaxrl": dict(num_envs=64, num_steps=128, num_minibatches=4, update_epochs=4),
}
SHARED = dict(learning_rate=2.5e-4, clip_vloss=True, ent_coef=0.01, gamma=0.99, gae_lambda=0.95, hidden=(64, 64),
              total_steps=10_000_000)


def child(settings: str, eager: bool = False) -> None:
    """Measure in this process (fnrl imported from PYTHONPATH's tree); print 'collect_ms update_ms'."""
    import torch

    from fnrl import envs
    from fnrl.algos import ppo
    from fnrl.samplers import SerialSampler
    try:   # the tree's layout: the speed plumbing in fnrl.accel and fnrl.run, or in fnrl.aot and fnrl.train before
        from fnrl.accel.aot import AotAct
        from fnrl.accel.compiled import HeldStance
        from fnrl.run.threads import intra_op_threads, update_threads_for
    except ImportError:
        from fnrl.aot import AotAct
        from fnrl.train import _HeldStance as HeldStance, _intra_op_threads as intra_op_threads, update_threads_for

    torch.set_num_threads(1)
    config = ppo.Config() if settings == "default" else ppo.Config(**SHARED, **SETTINGS[settings])
    agent = ppo.make(config, envs.env_spec(config.env_id, config.num_envs), compile=not eager)
    state = agent.init(0)
    threads = update_threads_for(config, False, 1, 1, False)
    env = envs.make(config.env_id, config.num_envs, seed=0)
    if threads > 1 and hasattr(env, "poll"):   # fnrl.train's rule, where the tree has it
        env.poll = False
    act = agent.act if eager else AotAct(agent.act, ppo.ACT_KEYS, fallback=None)
    sampler = SerialSampler(env, act, config.num_steps)
    collects, updates = [], []
    for i in range(23):
        if i == 3:
            stance = HeldStance()
            stance.hold(True)
        t = time.perf_counter()
        rollout = sampler.collect(state)
        state["env_steps"].add_(config.num_envs * config.num_steps)
        collected = time.perf_counter()
        with intra_op_threads(threads):
            state, _ = agent.update(state, rollout)
        if i >= 3:
            collects.append(collected - t)
            updates.append(time.perf_counter() - collected)
    stance.release()
    sampler.close()
    print(f"RESULT {statistics.median(collects) * 1e3:.3f} {statistics.median(updates) * 1e3:.3f} "
          f"{config.num_envs * config.num_steps}")


def run(tree: Path, settings: str, eager: bool) -> tuple[float, float, int]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--child", settings, *(["--eager"] if eager else [])], env=env,
                         cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    c, u, n = line.split()[1:]
    return float(c), float(u), int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="the earlier commit (any git revision)")
    parser.add_argument("--settings", default="default,purejaxrl")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUTPUT)
    parser.add_argument("--eager", action="store_true", help="the eager update and act (`--no-compile`)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.eager)
    if not args.base:
        parser.error("--base REV is required")
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from machine import cpu_model, prepend_report

    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    tier = "eager" if args.eager else "compiled"
    lines = [f"# PPO iterations ({tier}): {head} (+ working tree) against {base}, alternating processes", "",
             f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none (CPU only), Python "
             f"{platform.python_version()}. Load average at start: {load}. Generated by "
             f"`python benchmarks/commit_ab.py --base {args.base} --settings {args.settings} --pairs {args.pairs}"
             f"{' --eager' if args.eager else ''}`.", "",
             "Median ms per collect and per update of 20 iterations after 3 warm-up ones, each child process "
             "importing one tree; pairs run base then head.", "",
             "| settings | pair | base collect | base update | base SPS | head collect | head update | head SPS | "
             "head / base SPS |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for settings in args.settings.split(","):
                for pair in range(args.pairs):
                    (bc, bu, n), (hc, hu, _) = run(tree, settings, args.eager), run(ROOT, settings, args.eager)
                    b_sps, h_sps = n / (bc + bu) * 1e3, n / (hc + hu) * 1e3
                    lines.append(f"| {settings} | {pair + 1} | {bc:.1f} | {bu:.1f} | {b_sps:,.0f} | {hc:.1f} | "
                                 f"{hu:.1f} | {h_sps:,.0f} | {h_sps / b_sps:.2f}x |")
                    print(lines[-1], flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    prepend_report(args.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
