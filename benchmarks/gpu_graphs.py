"""PPO's acting step and update on a GPU: eager, compiled, and replayed from a CUDA graph.

    python benchmarks/gpu_graphs.py --out benchmarks/gpu_graphs.md     # needs a CUDA device

The settings: CartPole-v1's 64x64 MLP, 64 envs x 128 steps, 4 epochs x 4 minibatches
(a rollout of random CartPole-shaped data: the arithmetic does not depend on the values).
Small networks on a GPU are launch-bound (each kernel costs a few µs to launch from the
host, more than its arithmetic); a CUDA graph replays all of a call's kernels with one
launch. For each contender:

- act: µs per call of the policy on a [64, 4] observation copied from the host, sampled
  action copied back (what the serial sampler does each env step);
- update: ms per update (all 16 minibatch steps), after warm-up;
- the parameters after 3 updates from the same state against eager's (max abs difference).

Contenders: eager; compiled as `fnrl train` compiles (on a GPU `torch.compile`, the minibatch
steps as a loop of one compiled step, `fnrl.accel.staged.scan_on`; AOTInductor serves the CPU only); and replayed from
CUDA graphs as `fnrl train --cuda-graphs` does (`fnrl.accel.cudagraphs.GraphedUpdate`, the state
donated; `GraphedAct`, the observation copied into a fixed buffer). Last, whole training
runs at those settings, compiled and graphed: env steps per second and final return.
"""
from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from tensordict import TensorDict

T, B, HIDDEN = 128, 64, (64, 64)


def setup(device):
    from fnrl.algos import ppo
    from fnrl.envs.spec import EnvSpec

    spec = EnvSpec(env_id="CartPole-v1", num_envs=B, obs_shape=(4,), obs_dtype=torch.float32, action_shape=(),
                   action_dtype=torch.int64, num_actions=2)
    config = ppo.Config(num_envs=B, num_steps=T, num_minibatches=4, update_epochs=4, hidden=HIDDEN)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(T + 1, B, 4, generator=g)
    done = torch.rand(T, B, generator=g) < 0.02
    rollout = TensorDict({
        "obs": obs[:-1], "next_obs": obs[1:], "action": torch.randint(0, 2, (T, B), generator=g),
        "reward": torch.ones(T, B), "terminated": done, "truncated": torch.zeros(T, B, dtype=torch.bool),
        "done": done, "valid": torch.ones(T, B, dtype=torch.bool), "logp": torch.full((T, B), -0.69),
    }, batch_size=[T, B]).to(device)
    return ppo, spec, config, rollout


def timed(fn, n, device) -> float:
    """Seconds per call of fn(), after 3 warm-up calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - start) / n


def updates(rows, device, n):
    from fnrl.accel.cudagraphs import GraphedUpdate
    from fnrl.accel.compiled import make_agent

    ppo, spec, config, rollout = setup(device)
    results = {}

    def run(name, make_step):
        try:
            state = ppo.make(config, spec).init(0).to(device)
            step, order = make_step()
            torch.manual_seed(0)
            for _ in range(3):   # the compared parameters: 3 updates from the same state
                state = step(state, order)
            results[name] = state["params"].clone()
            per = timed(lambda: step(state, order), n, device)
            diff = max((results[name][k] - results["eager"][k]).abs().max().item()
                       for k in results["eager"].keys(True, True))
            rows.append(f"| {name} | {per * 1e3:.2f} | {diff:.1e} |")
        except Exception as e:   # report and carry on: this is a check
            rows.append(f"| {name} | FAILED: {type(e).__name__}: {str(e)[:200]} | |")
        print(rows[-1], flush=True)

    def plain(compile):
        agent = ppo.make(config, spec, compile=compile)

        return (lambda state, order: agent.update(state, rollout)[0]), None

    def graphed():
        agent = make_agent(ppo, config, spec, True)
        update = GraphedUpdate(agent.update)
        return (lambda state, order: update(state, rollout)[0]), None

    run("eager", lambda: plain(False))
    run("compiled (as fnrl train)", lambda: plain(True))
    run("CUDA graph (GraphedUpdate, as fnrl train --cuda-graphs)", graphed)


def acts(rows, device, n):
    from fnrl.accel.cudagraphs import GraphedAct
    from fnrl.accel.compiled import make_agent

    ppo, spec, config, _ = setup(device)
    host_obs = torch.randn(B, 4)
    host_obs = host_obs.pin_memory() if device.type == "cuda" else host_obs
    state = ppo.make(config, spec).init(0).to(device)

    def run(name, act):
        try:
            def call():
                obs = host_obs.to(device, non_blocking=True)
                action = act(obs)
                return action.cpu()
            per = timed(call, n, device)
            rows.append(f"| {name} | {per * 1e6:.0f} |")
        except Exception as e:
            rows.append(f"| {name} | FAILED: {type(e).__name__}: {str(e)[:200]} |")
        print(rows[-1], flush=True)

    eager = ppo.make(config, spec)
    run("eager", lambda obs: eager.act(state, obs, None, True)[0])
    compiled = make_agent(ppo, config, spec, True)
    run("compiled (as fnrl train)", lambda obs: compiled.act(state, obs, None, True)[0])
    graphed = GraphedAct(compiled.act, ppo.ACT_KEYS)
    run("CUDA graph (GraphedAct, as fnrl train --cuda-graphs)", lambda obs: graphed(state, obs, None, True)[0])


def training(rows, device, steps):
    """Whole runs at these settings: compiled and graphed (env steps/s past the first log rows)."""
    import dataclasses
    import tempfile

    from fnrl.train import train

    _, _, config, _ = setup(device)
    config = dataclasses.replace(config, total_steps=steps)
    for graphs in (False, True):
        try:
            start = time.perf_counter()
            result = train("ppo", config, seed=1, device=str(device), cuda_graphs=graphs, quiet=True,
                           tensorboard=False, plot=False, log_dir=tempfile.mkdtemp() + "/run")
            wall = time.perf_counter() - start
            late = result.history[len(result.history) // 2:]
            sps = sum(r["sps"] for r in late) / len(late)
            rows.append(f"| {'graphed' if graphs else 'compiled'} | {steps:,} | {result.return_mean:.1f} | "
                        f"{wall:.1f} | {sps:,.0f} |")
        except Exception as e:
            rows.append(f"| {'graphed' if graphs else 'compiled'} | FAILED: {type(e).__name__}: {str(e)[:200]} | | | |")
        print(rows[-1], flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/gpu_graphs.md")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (graphs need CUDA)")
    parser.add_argument("--steps", type=int, default=300_000, help="env steps of each training run")
    parser.add_argument("--train", action="store_true", help="run the training runs on the CPU too")
    parser.add_argument("--n", type=int, default=50, help="timed updates per contender (acts: 20x)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    machine = (f"{os.cpu_count()} CPU cores, GPU {gpu}, torch {torch.__version__}, "
               f"Python {platform.python_version()}")
    rows = [f"# PPO on a GPU: eager, compiled, CUDA-graphed\n\nMachine: {machine}.\n",
            f"Settings: CartPole-shaped 64x64 MLP, {B} envs x {T} steps, 4 epochs x 4 minibatches.\n",
            "## Update\n", "| contender | ms per update | max abs param diff vs eager after 3 updates |",
            "|---|---:|---:|"]
    updates(rows, device, args.n)
    rows += ["\n## Acting step (host obs -> GPU policy -> host action)\n", "| contender | µs per call |", "|---|---:|"]
    acts(rows, device, 20 * args.n)
    open(args.out, "w").write("\n".join(rows) + "\n")
    rows += ["\n## Training runs (`fnrl train ppo`, these settings, one seed)\n",
             "| steps replayed | env steps | return_mean | wall s | env steps/s (second half) |", "|---|---:|---:|---:|---:|"]
    if args.steps > 0 and (device.type == "cuda" or args.train):
        training(rows, device, args.steps)
    open(args.out, "w").write("\n".join(rows) + "\n")
    print("\n".join(rows))
