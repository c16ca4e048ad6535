"""IMPALA on CartPole-v1, env steps/s: actor processes over shared memory vs env hosts over torch.distributed.

The one-machine central sampler (`fnrl.samplers.central`: actor processes, requests through
shared memory and pipes) against the same number of env hosts (`--actor-hosts N`,
`fnrl.distributed.env_hosts`: gloo on loopback, one message each way per env step), with
the inference batch reached (host requests per forward), the bytes per env step on the wire,
and a paper estimate of how many hosts one learner core can serve.

IMPALA's CartPole preset (8 envs per actor, T = 10, 2 trajectories per update), eager update
(the transport, not compilation, is what differs), threads=1. Contenders alternate within each
round (`--rounds`); each row is the steady-state rate, (env steps) / (wall seconds) between the
first log row past a fifth of the run and the last.

CPU cost per env step, for the estimate: the learner process's CPU seconds (`RUSAGE_SELF`) and
the local hosts' (`RUSAGE_CHILDREN`, once they are joined), differenced between a run of
`--steps` and one of `--steps / 10`, so the start-up of the processes cancels out.

    python benchmarks/probes/env_hosts.py [--steps 60000] [--rounds 2]    # writes env_hosts.md
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

from fnrl.presets import configure
from fnrl.train import train

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from machine import cpu_model  # noqa: E402


def contenders(actors: list[int]) -> dict:
    out = {}
    for n in actors:
        out[f"{n} actor process{'es' * (n > 1)} (shared memory)"] = (n, 0)
        out[f"{n} env host{'s' * (n > 1)} (gloo, loopback)"] = (n, n)
    return out


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def run(actors: int, hosts: int, steps: int) -> dict:
    config = dataclasses.replace(configure("impala")[0], total_steps=steps, num_actors=actors)
    before = _cpu()
    with tempfile.TemporaryDirectory() as tmp:
        result = train("impala", config, seed=0, log_dir=Path(tmp) / "run", quiet=True, compile=False,
                       log_interval=2_000, tensorboard=False, plot=False, actor_hosts=hosts, eval_episodes=0)
    after = _cpu()
    late = [r for r in result.history if r["env_steps"] > steps // 5]
    first, last = late[0], late[-1]
    return {"sps": (last["env_steps"] - first["env_steps"]) / max(last["wall_s"] - first["wall_s"], 1e-9),
            "batch": statistics.mean(r["inference_batch"] for r in late),
            "lag": statistics.mean(r["policy_lag_mean"] for r in late),
            "cpu": (after[0] - before[0], after[1] - before[1])}


def per_step(long: dict, short: dict, steps: int) -> tuple[float, float]:
    """(learner, hosts) CPU microseconds per env step, start-up differenced out."""
    span = steps - steps // 10
    return tuple(1e6 * (long["cpu"][i] - short["cpu"][i]) / span for i in range(2))


def bytes_per_step() -> float:
    from fnrl import envs
    from fnrl.algos import impala
    from fnrl.distributed.env_hosts import EnvHosts

    config = configure("impala")[0]
    spec = envs.env_spec(config.env_id)
    agent = impala.make(config, spec)
    return EnvHosts(agent.act, agent.init(0), hosts=1, num_envs=config.num_envs, horizon=config.num_steps,
                    obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype).bytes_per_step


SEED_DMLAB = (330_000, 8)
"""SEED RL's DeepMind Lab throughput with one learner of 8 TPU v3 cores, frames/s (Espeholt et al. 2020,
arXiv:1910.06591, Table 1)."""


def estimate(names: list[str], costs: dict) -> list[str]:
    """The paper estimate: the env steps/s one learner core can serve, from the largest host count
    measured, and how many hosts that feeds for envs of a given step cost."""
    hosted = names[-1]
    learner = statistics.median(c[0] for c in costs[hosted])
    shared = statistics.median(c[0] for c in costs[names[-2]])
    host = statistics.median(c[1] for c in costs[hosted])
    capacity = 1e6 / learner
    lines = ["Paper estimate. With env hosts, the learner spends "
             f"{learner:.0f} µs of CPU per env step (receiving, assembling, inference, the update, sending; "
             f"{shared:.0f} µs with actor processes over shared memory), so one learner core serves at most "
             f"{capacity:,.0f} env steps/s. A host spends {host:.0f} µs per env step (EnvPool's calls, the wire and "
             "its bookkeeping), plus the env's own step cost e; one learner core therefore feeds "
             f"(e + {host:.0f} µs) / {learner:.0f} µs host cores:", "",
             "| env step cost e (one env, one core) | host cores one learner core feeds |", "|---:|---:|"]
    for e_us, what in ((1, " (CartPole)"), (100, ""), (1_000, ""), (5_000, "")):
        lines.append(f"| {e_us:,} µs{what} | {(e_us + host) / learner:,.1f} |")
    frames, cores = SEED_DMLAB
    lines += ["", f"SEED RL reports {frames:,} frames/s on DeepMind Lab from one learner of {cores} TPU v3 cores "
              f"(Table 1 of the paper), {frames // cores:,} per accelerator core (frames, not agent steps: an agent "
              "step there repeats its action over several frames); fnrl's learner here serves "
              f"{capacity:,.0f} env steps/s per CPU core with a 64-unit MLP, where each forward serves a few hosts "
              "of 8 envs. SEED reaches its figure by batching thousands of envs per forward on accelerators; "
              "fnrl's env hosts batch every live host's request into one forward on --device too, but no GPU "
              "measurement exists yet."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--out", default=str(HERE / "env_hosts.md"))
    args = parser.parse_args()
    load = os.getloadavg()
    table = contenders([int(a) for a in args.actors.split(",")])
    results = {name: [] for name in table}
    costs = {name: [] for name in table}
    for _ in range(args.rounds):
        for name, (actors, hosts) in table.items():
            long = run(actors, hosts, args.steps)
            results[name].append(long)
            costs[name].append(per_step(long, run(actors, hosts, args.steps // 10), args.steps))
            print(name, long, costs[name][-1], flush=True)
    lines = [f"# {__doc__.splitlines()[0]}", "",
             f"Machine: {cpu_model()}, {os.cpu_count()} cores, torch threads 1; load average {load[0]:.2f} before. "
             f"{args.rounds} rounds of {args.steps:,} env steps each, contenders alternating.", "",
             "| actors | env steps/s, median (range) | vs shared memory | inference batch (requests per forward) "
             "| policy lag | learner CPU µs / env step | actors' CPU µs / env step |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    names = list(table)
    for i, name in enumerate(names):
        base = statistics.median(r["sps"] for r in results[names[i - i % 2]])
        sps = [r["sps"] for r in results[name]]
        learner = statistics.median(c[0] for c in costs[name])
        actors = statistics.median(c[1] for c in costs[name])
        lines.append(f"| {name} | {statistics.median(sps):,.0f} ({min(sps):,.0f}-{max(sps):,.0f}) | "
                     f"{statistics.median(sps) / base:.2f}x | {statistics.mean(r['batch'] for r in results[name]):.2f} "
                     f"| {statistics.mean(r['lag'] for r in results[name]):.2f} | {learner:.0f} | {actors:.0f} |")
    lines += ["", f"On the wire: {bytes_per_step():.0f} bytes per env step, both ways, headers included (CartPole's "
              "4 float32 observations, reward, flags and episode statistics up; the int64 action down).", ""]
    lines += estimate(names, costs)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
