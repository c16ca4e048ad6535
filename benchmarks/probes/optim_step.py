"""Time one functional optimizer step (fnrl.optim, compiled) against torch.optim.Adam(foreach=True).

Two parameter sets:
  (a) a CartPole actor-critic: two MLPs 4-64-64 with a 2-logit and a 1-value head;
  (b) the Nature DQN CNN (Mnih et al. 2015): 3 conv + 512 fc on 84x84x4 frames, 6 actions.

Two measurements for each:
  update: gradients already computed; fnrl `adam.update` + `apply_updates` vs `optimizer.step()`;
  step:   the whole loss -> grad -> Adam -> new params; fnrl `torch.func.grad` + update compiled
          with fullgraph=True vs eager `zero_grad(); loss.backward(); optimizer.step()`.

Each time is the median over many calls after warm-up, the contenders timed in
alternating rounds so that the load of a shared machine hits them alike. Prints a markdown table and writes it,
with the machine's description, to benchmarks/probes/optim_step.md.

    python benchmarks/probes/optim_step.py [--threads N]
"""
from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from pathlib import Path

import tensordict
import torch
from tensordict import TensorDict
from torch import nn

from fnrl.distributions import categorical_entropy, categorical_log_prob
from fnrl.optim import adam, apply_updates

import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

LR = 2.5e-4
OUTPUT = Path(__file__).with_suffix(".md")


# ---------------------------------------------------------------------------
# the two problems
# ---------------------------------------------------------------------------


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int = 4, num_actions: int = 2, hidden: int = 64):
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_actions)
        )
        self.critic = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def forward(self, obs):
        return self.actor(obs), self.critic(obs).squeeze(-1)


def actor_critic_loss(outputs, batch):
    """A PPO-sized loss: policy gradient + value regression - entropy bonus."""
    logits, value = outputs
    log_prob = categorical_log_prob(logits, batch["action"])
    policy = -(log_prob * batch["advantage"]).mean()
    critic = 0.5 * (value - batch["return"]).square().mean()
    return policy + critic - 0.01 * categorical_entropy(logits).mean()


def nature_cnn(num_actions: int = 6) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, num_actions),
    )


def q_loss(q_values, batch):
    """A DQN-sized loss: squared TD error of the taken action against a given target."""
    q_taken = q_values.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    return 0.5 * (q_taken - batch["target"]).square().mean()


def mlp_problem():
    torch.manual_seed(0)
    n = 128  # a PPO minibatch for CartPole
    batch = {
        "obs": torch.randn(n, 4),
        "action": torch.randint(0, 2, (n,)),
        "advantage": torch.randn(n),
        "return": torch.randn(n),
    }
    return "MLP 64-64 actor-critic (CartPole)", ActorCritic(), actor_critic_loss, batch, n


def cnn_problem():
    torch.manual_seed(0)
    n = 32  # a DQN replay minibatch
    batch = {"obs": torch.rand(n, 4, 84, 84), "action": torch.randint(0, 6, (n,)), "target": torch.randn(n)}
    return "Nature CNN (84x84x4, 6 actions)", nature_cnn(), q_loss, batch, n


# ---------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------


def interleaved_median_ms(fns: dict, rounds: int, calls: int, warmup: int = 3) -> dict:
    """Median milliseconds per call of each function, timed in alternating rounds.

    Each round times `calls` calls of every function, rotating which goes first, so a
    change in the load of the shared machine hits all of them alike.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = fns[name]
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


def bench(problem, rounds: int, calls_update: int, calls_step: int) -> list[dict]:
    name, net, loss_of_outputs, batch, batch_size = problem()
    num_params = sum(p.numel() for p in net.parameters())
    tx = adam(LR)

    # --- fnrl: pure functions over a parameter TensorDict
    params = TensorDict.from_module(net).detach().clone()
    state = tx.init(params)

    def loss_fn(params, batch):
        outputs = torch.func.functional_call(net, params.flatten_keys(".").to_dict(), (batch["obs"],))
        return loss_of_outputs(outputs, batch)

    grads = torch.func.grad(loss_fn)(params, batch)

    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return apply_updates(params, updates), state

    def train_step(params, state, batch):
        grads, loss = torch.func.grad_and_value(loss_fn)(params, batch)
        updates, state = tx.update(grads, state, params)
        return apply_updates(params, updates), state, loss

    compiled_update = torch.compile(update, fullgraph=True)
    compiled_step = torch.compile(train_step, fullgraph=True)

    # --- torch.optim on the module itself
    torch_net = copy.deepcopy(net)
    optimizer = torch.optim.Adam(torch_net.parameters(), lr=LR, foreach=True)
    flat_grads = grads.flatten_keys(".")
    for key, p in torch_net.named_parameters():
        p.grad = flat_grads[key].clone()

    def torch_step():
        optimizer.zero_grad()
        loss_of_outputs(torch_net(batch["obs"]), batch).backward()
        optimizer.step()

    start = time.perf_counter()
    compiled_update(params, state, grads)
    compile_update_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled_step(params, state, batch)
    compile_step_s = time.perf_counter() - start

    update_ms = interleaved_median_ms(
        {
            "fnrl_compiled": lambda: compiled_update(params, state, grads),
            "fnrl_eager": lambda: update(params, state, grads),
            "torch": optimizer.step,
        },
        rounds=rounds,
        calls=calls_update,
    )
    step_ms = interleaved_median_ms(
        {
            "fnrl_compiled": lambda: compiled_step(params, state, batch),
            "fnrl_eager": lambda: train_step(params, state, batch),
            "torch": torch_step,
        },
        rounds=rounds,
        calls=calls_step,
    )
    common = dict(problem=name, params=num_params)
    rows = [
        dict(common, what="update (grads given)", compile_s=compile_update_s, **update_ms),
        dict(common, what=f"loss -> grad -> update (batch {batch_size})", compile_s=compile_step_s, **step_ms),
    ]
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Optimizer step: fnrl.optim (functional, compiled) vs torch.optim.Adam(foreach=True)",
        "",
        f"Machine: {os.cpu_count()} CPUs ({cpu_model()}), torch {torch.__version__}, "
        f"tensordict {tensordict.__version__}, torch threads {torch.get_num_threads()}, "
        f"Python {platform.python_version()}. CPU only, float32, Adam lr={LR}.",
        "",
        "Median wall time of one call in milliseconds after warm-up, the three columns of a row "
        "timed in alternating rounds. `fnrl compiled` is "
        "`torch.compile(fullgraph=True)` of `adam.update` + `apply_updates` (and, in the "
        "whole-step rows, of `torch.func.grad` of the loss too); `fnrl eager` is the same "
        "function uncompiled; `torch` is `optimizer.step()` (whole step: `zero_grad`, "
        "forward, `backward`, `step`). Ratio = torch / fnrl compiled (> 1: fnrl faster).",
        "",
        "| parameters | measured | fnrl compiled ms | fnrl eager ms | torch.optim ms | ratio | compile s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['problem']}, {r['params']:,} params | {r['what']} | {r['fnrl_compiled']:.3f} | "
            f"{r['fnrl_eager']:.3f} | {r['torch']:.3f} | {r['torch'] / r['fnrl_compiled']:.2f} | {r['compile_s']:.1f} |"
        )
    lines += [
        "",
        "Generated by `python benchmarks/probes/optim_step.py`. The machine is shared, so absolute "
        "times move between runs; the ratios are the result.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a small shared machine, OpenMP threads "
        "waiting for a busy core make 2-thread timings swing by 10x)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = bench(mlp_problem, rounds=6, calls_update=50, calls_step=25)
    rows += bench(cnn_problem, rounds=4, calls_update=10, calls_step=3)
    text = markdown(rows)
    print(text)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
