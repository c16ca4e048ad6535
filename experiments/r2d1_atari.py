"""R2D1 on Atari with rlpyt's settings, as `fnrl.algos.r2d1.Config` overrides.

    python experiments/r2d1_atari.py --game Pong [--seed 0] [--total-steps N] [--device cuda]

Settings follow rlpyt's R2D1 Atari config (rlpyt/experiments/configs/atari/dqn/atari_r2d1.py
and rlpyt/algos/dqn/r2d1.py): gamma 0.997; sequences of 80 trained steps after a burn-in
("warmup") of 40, recurrent state stored every 40 steps; batch of 64 sequences; 5-step
double-Q targets under value rescaling (eps 1e-3), squared TD loss; prioritized replay
with alpha 0.9, beta 0.6 and sequence priorities eta max + (1 - eta) mean with eta 0.9,
input priorities from the actors' Q-values; Adam lr 1e-4, eps 1e-3; gradient-norm clip 80;
target network copied every 2,500 updates; 1M-step replay; 100k steps before learning;
sampler batch_T=40 x batch_B=32; per-env final epsilons log-spaced from 0.0005 to 0.1.
The network is rlpyt's R2d1Model without its previous-action / previous-reward inputs:
Nature conv torso + fc 512, LSTM 512, dueling head of 512 units per stream.

rlpyt's replay ratio 4 counts replayed samples per generated sample: one update of
64 x 80 = 5120 samples per 1280 env steps, i.e. `replay_ratio = 1 / 1280` updates per env
step here. Differences from rlpyt: fnrl's training loop anneals beta from 0.6 to 1 (rlpyt
keeps 0.6), and fnrl's Atari training env clips rewards (rlpyt's R2D1 runs unclipped,
relying on value rescaling alone). rlpyt reports 16,000 env steps/s for R2D1 on 24 CPUs
and 3 GPUs (its asynchronous sampler); fnrl runs the serial sampler.
"""
from __future__ import annotations

import argparse
import dataclasses

ATARI_R2D1 = dict(
    total_steps=50_000_000,
    num_envs=32,
    num_steps=40,
    buffer_size=1_000_000 // (32 * 40) * (32 * 40),
    batch_size=64,
    learning_starts=100_000,
    replay_ratio=1 / 1280,
    burn_in=40,
    seq_len=80,
    carry_interval=40,
    n_step=5,
    gamma=0.997,
    value_rescale=True,
    rescale_eps=1e-3,
    prioritized=True,
    priority_alpha=0.9,
    priority_beta=0.6,
    priority_eta=0.9,
    input_priorities=True,
    learning_rate=1e-4,
    optimizer_eps=1e-3,
    max_grad_norm=80.0,
    target_update_interval=2_500,
    tau=1.0,
    eps_init=1.0,
    eps_final=0.1,
    eps_final_min=0.0005,
    eps_steps=150_000,
    eps_eval=0.001,
    core="lstm",
    core_size=512,
    head_hidden=512,
    conv="nature",
)
"""Config overrides for any Atari game (set env_id)."""

GAMES = {"Pong": "Pong-v5", "Breakout": "Breakout-v5"}


def atari_config(game: str, **overrides):
    """The full `r2d1.Config` on `game` ("Pong", "Breakout" or an EnvPool id)."""
    from fnrl.algos import r2d1

    return dataclasses.replace(r2d1.Config(), **{**ATARI_R2D1, "env_id": GAMES.get(game, game), **overrides})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong", help="Pong, Breakout or any EnvPool Atari id")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()

    from fnrl.train import train

    overrides = {} if args.total_steps is None else {"total_steps": args.total_steps}
    config = atari_config(args.game, **overrides)
    result = train("r2d1", config, seed=args.seed, log_dir=args.log_dir, device=args.device, compile=True,
                   threads=None)
    print(f"r2d1 {config.env_id} seed {args.seed}: return_mean {result.return_mean:.1f}")


if __name__ == "__main__":
    main()
