"""TD3's delayed actor step: what an update costs on and off the `policy_delay` cadence.

TD3 (policy_delay 2) picks its step with `fnrl.algos.common.switch` (torch.cond): on the
cadence the full step (critics + actor + targets), off it the critics' step alone. This
times the compiled update (HalfCheetah-v4 shapes, 256-256 nets, batch 256, one torch
thread, guards skipped as in training) on its own steps, medians over interleaved rounds.

With `--before FILE` (a `qpg.py` of another revision, e.g.
`git show 3f18c8b:fnrl/algos/qpg.py > /tmp/qpg_before.py`, the last one that masked the
actor step instead of skipping it) both implementations are compiled in this process and
timed in alternating rounds, so a change in machine load hits both alike.

    python benchmarks/probes/td3_delay.py [--rounds 10] [--before FILE] [--out FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from fnrl import envs
from fnrl.algos import qpg
from fnrl.accel.compiled import steady

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("qpg_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class Contender:
    def __init__(self, module, env_spec, batch: TensorDict):
        config = dataclasses.replace(module.Config(), **module.VARIANTS["td3"], env_id="HalfCheetah-v4",
                                     batch_size=len(batch), hidden=(256, 256))
        self.update = torch.compile(module.make(config, env_spec).update, fullgraph=True, dynamic=False)
        self.state = module.make(config, env_spec).init(0)
        self.batch = batch
        self.times = {True: [], False: []}   # on the cadence / off it
        for _ in range(4):
            self.state, _ = self.update(self.state, batch)

    def round(self, n: int = 20) -> None:
        with steady(True):
            for _ in range(n):
                on = int(self.state["updates"]) % 2 == 0
                t = time.perf_counter()
                self.state, _ = self.update(self.state, self.batch)
                self.times[on].append(time.perf_counter() - t)

    def median_ms(self, on: bool) -> float:
        return 1e3 * statistics.median(self.times[on])

    def mean_ms(self) -> float:
        """Per update over a cycle of policy_delay 2: the mean of the two medians."""
        return (self.median_ms(True) + self.median_ms(False)) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before", help="a qpg.py to time side by side with this one")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = envs.make("HalfCheetah-v4", 1, seed=0)
    n, obs_dim, act_dim = 256, env.spec.obs_shape[0], env.spec.action_dim
    g = torch.Generator().manual_seed(0)
    batch = TensorDict({"obs": torch.randn(n, obs_dim, generator=g), "next_obs": torch.randn(n, obs_dim, generator=g),
                        "action": torch.rand(n, act_dim, generator=g) * 2 - 1, "reward": torch.randn(n, generator=g),
                        "discount": torch.full((n,), 0.99), "weight": torch.ones(n)}, batch_size=[n])
    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    contenders = {"switch (this revision)": Contender(qpg, env.spec, batch)}
    if args.before:
        contenders[f"before ({args.before})"] = Contender(load_module(args.before), env.spec, batch)
    for _ in range(args.rounds):
        for c in contenders.values():
            c.round()
    lines = [
        "# TD3's delayed actor step: update cost on and off the cadence",
        "",
        f"Machine: nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: none used, torch {torch.__version__} "
        f"(1 intra-op thread), Python {platform.python_version()}. Load average at start {load_start}, at end "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "Compiled TD3 update (policy_delay 2), HalfCheetah-v4 shapes, 256-256 nets, batch 256; medians over "
        f"{args.rounds} interleaved rounds of 20 updates each.",
        "",
        "| implementation | on the cadence, ms | off it, ms | per update (mean of the two), ms |",
        "|---|---:|---:|---:|",
    ]
    for name, c in contenders.items():
        lines.append(f"| {name} | {c.median_ms(True):.2f} | {c.median_ms(False):.2f} | {c.mean_ms():.2f} |")
    if args.before:
        this, before = contenders.values()
        lines += ["", f"Per update, this revision is **{before.mean_ms() / this.mean_ms():.2f}x** as fast."]
    lines += ["", "Reproduce: `python benchmarks/probes/td3_delay.py" + (f" --before {args.before}`" if args.before else "`"), ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
