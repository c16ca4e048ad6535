"""GPU check and throughput: every algorithm's loop on `--device cuda`, and the PPO
Nature-CNN update on the GPU vs the CPU.

    python benchmarks/gpu_check.py --out benchmarks/gpu_check.md

1. Short training runs with `device="cuda"` (policy, rollout buffers, replay and
   updates on the GPU; EnvPool steps on the CPU) for PPO, A2C, DQN, C51 and SAC on
   classic-control tasks: the loop must run and, for the longer runs, learn.
2. PPO's update with the Nature CNN at CleanRL's Atari settings (8 envs x 128 steps,
   4 epochs x 4 minibatches of 256) on a synthetic Pong-shaped rollout: seconds per
   update, eager vs compiled, GPU vs CPU.
3. Compiled == eager for that update on the GPU.
4. The off-policy learner step replayed from a CUDA graph (`--cuda-graphs`, fnrl.accel.cudagraphs)
   against the same step called compiled: parameters after the same short run, and env steps
   per second of both (DQN CartPole with CleanRL's settings, SAC HalfCheetah-v4 with batch 256).

The sections run in the order 4, 2, 3, 1, and the report is written after each, so a run cut
off by a device lease keeps what finished. Its first run (an H200) crashed in
every section on faults fixed since (`benchmarks/gpu_graphs.md`, notes); PPO's GPU numbers are
in `gpu_graphs.py`.
"""
from __future__ import annotations

import argparse
import dataclasses
import platform
import time

import torch


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    import os

    return (f"{os.cpu_count()} CPU cores, GPU: {gpu}, torch {torch.__version__}, Python {platform.python_version()}, "
            f"torch threads {torch.get_num_threads()}")


def training_runs(rows: list[str], device: str = "cuda") -> None:
    from fnrl import algos
    from fnrl.train import train

    cases = [("ppo", {}, 100_000, 475), ("a2c", {"total_steps": 60_000}, None, None),
             ("dqn", {"total_steps": 30_000}, None, None), ("c51", {"total_steps": 20_000}, None, None),
             ("sac", {"total_steps": 6_000}, None, None)]
    for name, overrides, steps, threshold in cases:
        try:
            config = dataclasses.replace(algos.default_config(name), **overrides)
            t = time.perf_counter()
            result = train(name, config, seed=1, device=device, quiet=True, tensorboard=False, plot=False,
                           log_dir=f"/tmp/gpu-{name}")
            wall = time.perf_counter() - t
            ok = "" if threshold is None else (" (>= %d: %s)" % (threshold, "yes" if result.return_mean >= threshold else "NO"))
            rows.append(f"| {name} | {config.env_id} | {config.total_steps:,} | {result.return_mean:.1f}{ok} | "
                        f"{wall:.1f} | {result.history[-1]['sps']:.0f} |")
        except Exception as e:  # report and carry on: this is a check
            rows.append(f"| {name} | - | - | FAILED: {type(e).__name__}: {str(e)[:150]} | - | - |")
        print(rows[-1], flush=True)


def synthetic_pong_rollout(device, T=128, B=8):
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(0)
    obs = torch.randint(0, 255, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g)
    done = torch.rand(T, B, generator=g) < 0.01
    return TensorDict({
        "obs": obs[:-1], "next_obs": obs[1:], "action": torch.randint(0, 6, (T, B), generator=g),
        "reward": torch.randn(T, B, generator=g).sign() * (torch.rand(T, B, generator=g) < 0.05),
        "terminated": done, "truncated": torch.zeros(T, B, dtype=torch.bool), "done": done,
        "valid": torch.ones(T, B, dtype=torch.bool), "logp": torch.full((T, B), -1.79),
        "value": torch.zeros(T, B),
    }, batch_size=[T, B]).to(device)


def cnn_update(rows: list[str], devices) -> None:
    from fnrl.algos import ppo
    from fnrl.envs.spec import EnvSpec

    spec = EnvSpec(env_id="Pong-v5", num_envs=8, obs_shape=(4, 84, 84), obs_dtype=torch.uint8, action_shape=(),
                   action_dtype=torch.int64, num_actions=6, is_atari=True)
    config = ppo.Config(env_id="Pong-v5", num_envs=8, num_steps=128, num_minibatches=4, update_epochs=4,
                        learning_rate=2.5e-4, clip_coef=0.1, clip_vloss=True, ent_coef=0.01, total_steps=10_000_000)
    for device in devices:
        rollout = synthetic_pong_rollout(device)
        for compiled in (False, True):
            agent = ppo.make(config, spec, compile=compiled)
            state = agent.init(0).to(device)
            t0 = time.perf_counter()
            state, _ = agent.update(state, rollout)
            if device == "cuda":
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            reps = 5 if device == "cuda" else 2
            t0 = time.perf_counter()
            for _ in range(reps):
                state, m = agent.update(state, rollout)
            if device == "cuda":
                torch.cuda.synchronize()
            per = (time.perf_counter() - t0) / reps
            rows.append(f"| {device} | {'compiled' if compiled else 'eager'} | {first:.2f} | {per * 1000:.1f} | "
                        f"{1024 / per:,.0f} |")
            print(rows[-1], flush=True)


def compiled_equals_eager(rows: list[str], device: str = "cuda") -> None:
    from fnrl.algos import ppo
    from fnrl.envs.spec import EnvSpec

    spec = EnvSpec(env_id="Pong-v5", num_envs=8, obs_shape=(4, 84, 84), obs_dtype=torch.uint8, action_shape=(),
                   action_dtype=torch.int64, num_actions=6, is_atari=True)
    config = ppo.Config(env_id="Pong-v5", num_envs=8, num_steps=128, num_minibatches=4, update_epochs=1,
                        total_steps=10_000_000)
    rollout = synthetic_pong_rollout(device)
    eager, comp = ppo.make(config, spec), ppo.make(config, spec, compile=True)
    state = eager.init(0).to(device)
    torch.manual_seed(5)
    a, _ = eager.update(state, rollout)
    torch.manual_seed(5)
    b, _ = comp.update(state, rollout)
    diff = max((x - b["params"][k]).abs().max().item() for k, x in a["params"].items(True, True))
    rows.append(f"max |eager - compiled| over all parameters after one update on the GPU: {diff:.2e}")
    print(rows[-1], flush=True)


def graphed_learner(rows: list[str], device: str = "cuda") -> None:
    from fnrl import algos
    from fnrl.train import train

    cases = [("dqn", dict(env_id="CartPole-v1", num_envs=1, num_steps=10, buffer_size=10_000, batch_size=128,
                          learning_starts=1_000, replay_ratio=0.1, hidden=(120, 84), activation="relu",
                          total_steps=11_000)),
             ("sac", dict(env_id="HalfCheetah-v4", num_envs=1, num_steps=1, buffer_size=100_000, batch_size=256,
                          learning_starts=1_000, total_steps=3_000))]
    for name, overrides in cases:
        config = dataclasses.replace(algos.default_config(name), **overrides)
        try:
            runs = {}
            for graphs in (False, True):
                result = train(name, config, seed=1, device=device, cuda_graphs=graphs, quiet=True, tensorboard=False,
                               plot=False, log_dir=f"/tmp/gpu-graphs-{name}-{graphs}")
                runs[graphs] = result
            diff = max((x - runs[True].state["params"][k]).abs().max().item()
                       for k, x in runs[False].state["params"].items(True, True))
            sps = [runs[g].history[-1]["sps"] for g in (False, True)]
            rows.append(f"| {name} | {config.env_id} | {config.total_steps:,} | {sps[0]:,.0f} | {sps[1]:,.0f} | "
                        f"{sps[1] / sps[0]:.2f}x | {diff:.2e} |")
        except Exception as e:  # report and carry on: this is a check
            rows.append(f"| {name} | {config.env_id} | - | FAILED: {type(e).__name__}: {str(e)[:200]} | | | |")
        print(rows[-1], flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/gpu_check.md")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script (section 4 then fails)")
    args = parser.parse_args()
    torch.set_float32_matmul_precision("high")
    rows = [f"# GPU check\n\nMachine: {machine()}.\n"]

    def section1():
        rows.extend(["\n## 1. Training loops on the GPU\n", "| algo | env | steps | return_mean | wall s | last sps |",
                     "|---|---|---|---|---|---|"])
        training_runs(rows, args.device)

    def section2():
        rows.extend(["\n## 2. PPO update, Nature CNN, CleanRL Atari settings (1024 samples, 4 x 4 minibatches)\n",
                     "| device | mode | first call s (incl. compile) | ms per update | samples/s |", "|---|---|---|---|---|"])
        cnn_update(rows, sorted({args.device, "cpu"}, reverse=True))

    def section3():
        rows.append("\n## 3. Compiled vs eager on the GPU\n")
        compiled_equals_eager(rows, args.device)

    def section4():
        rows.extend(["\n## 4. Off-policy learner step: CUDA-graphed vs compiled\n",
                     "| algo | env | steps | sps compiled | sps graphed | ratio | max abs param diff |",
                     "|---|---|---|---|---|---|---|"])
        graphed_learner(rows, args.device)

    # the most telling first: a run cut off by its time limit leaves the report of what finished
    for section in (section4, section2, section3) + (() if args.skip_train else (section1,)):
        try:
            section()
        except Exception as e:
            rows.append(f"FAILED: {type(e).__name__}: {str(e)[:300]}")
            print(rows[-1], flush=True)
        open(args.out, "w").write("\n".join(rows) + "\n")
