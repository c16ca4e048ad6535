"""The DQN family on Atari with rlpyt's settings, as `fnrl.algos.dqn.Config` overrides.

    python experiments/dqn_atari.py --variant dqn --game Pong [--seed 0] [--total-steps N]
    python experiments/dqn_atari.py --variant rainbow --game Breakout --device cuda

Settings follow rlpyt's `DQN` defaults (rlpyt/algos/dqn/dqn.py): Adam with lr 2.5e-4 and
eps 0.01 / batch_size, batch 32, replay ratio 8 (samples consumed per sample generated:
one update of 32 per 4 env steps, i.e. `replay_ratio=0.25` updates per env step), 50k
steps before learning, a 1M replay, gradient-norm clip 10, Huber delta 1, epsilon from 1
to 0.01 over 1M steps (ramping from `learning_starts`, as rlpyt's agent), evaluation
epsilon 0.001; rlpyt's sampler shape batch_T=2, batch_B=16. The target network is copied
every 2,500 updates = 10k env steps (the Nature DQN code's period; rlpyt's default of 312
updates counts 312 x 32 = 1e4 replayed samples). rlpyt's "rmsprop" config uses RMSprop
alpha 0.95, eps 1e-6, lr 2.5e-4: `ATARI["dqn_rmsprop"]`.

The variants on top (rlpyt/experiments/configs/atari/dqn/atari_dqn.py):
- c51: categorical head, 51 atoms on [-10, 10], lr 2.5e-4 (rlpyt "catdqn");
- rainbow: rlpyt's "ernbw", Rainbow minus noisy nets: double + dueling + C51 + 3-step
  returns + prioritized replay (alpha 0.5, beta 0.4 -> 1), lr 6.25e-5, Adam eps 1.5e-4
  (Hessel et al. 2018, Table 1);
- qrdqn: 200 quantiles, lr 5e-5, Adam eps 0.01/32 (Dabney et al. 2018a);
- iqn: N = N' = 64, K = 32, 64 cosine features, lr 5e-5, Adam eps 0.01/32 (Dabney et al. 2018b).

Targets: CleanRL's scores after 10M env steps (docs.cleanrl.dev, dqn_atari.py and
c51_atari.py, mean over seeds): DQN Pong 20.3, Breakout 367; C51 Pong 19.5. The Atari env
is EnvPool's v5 task with fnrl's training wrappers (episodic life, reward clipping; frame
skip 4, 84x84 grayscale, 4 stacked frames); evaluation episodes report the raw game score.
"""
from __future__ import annotations

import argparse
import dataclasses

ATARI_DQN = dict(
    total_steps=10_000_000,
    num_envs=16,
    num_steps=2,
    buffer_size=1_000_000,
    batch_size=32,
    learning_starts=50_000,
    replay_ratio=0.25,
    n_step=1,
    gamma=0.99,
    prioritized=False,
    optimizer="adam",
    learning_rate=2.5e-4,
    optimizer_eps=0.01 / 32,
    max_grad_norm=10.0,
    huber_delta=1.0,
    target_update_interval=2_500,
    tau=1.0,
    double_q=False,
    dueling=False,
    head="q",
    eps_init=1.0,
    eps_final=0.01,
    eps_steps=1_000_000,
    eps_eval=0.001,
    conv="nature",
)

ATARI: dict[str, dict] = {
    "dqn": ATARI_DQN,
    "dqn_rmsprop": {**ATARI_DQN, "optimizer": "rmsprop", "rmsprop_alpha": 0.95, "optimizer_eps": 1e-6},
    "c51": {**ATARI_DQN, "head": "categorical", "num_atoms": 51, "v_min": -10.0, "v_max": 10.0},
    "rainbow": {**ATARI_DQN, "head": "categorical", "num_atoms": 51, "v_min": -10.0, "v_max": 10.0,
                "double_q": True, "dueling": True, "n_step": 3, "prioritized": True, "priority_alpha": 0.5,
                "priority_beta": 0.4, "learning_rate": 6.25e-5, "optimizer_eps": 1.5e-4},
    "qrdqn": {**ATARI_DQN, "head": "quantile", "num_quantiles": 200, "learning_rate": 5e-5},
    "iqn": {**ATARI_DQN, "head": "iqn", "num_tau_samples": 64, "num_tau_prime_samples": 64,
            "num_quantile_samples": 32, "cosine_dim": 64, "learning_rate": 5e-5},
}
"""Variant -> Config overrides for any Atari game (set env_id)."""

GAMES = {"Pong": "Pong-v5", "Breakout": "Breakout-v5"}

TARGETS = {("dqn", "Pong"): 20.3, ("dqn", "Breakout"): 367.0, ("c51", "Pong"): 19.5}
"""CleanRL's mean episodic return after 10M env steps, the scores to reach."""

# the fnrl command-line name of each variant (dqn_rmsprop is dqn with other settings)
ALGO_NAME = {"dqn": "dqn", "dqn_rmsprop": "dqn", "c51": "c51", "rainbow": "rainbow", "qrdqn": "qrdqn", "iqn": "iqn"}


def atari_config(variant: str, game: str, **overrides):
    """The full `dqn.Config` of `variant` on `game` ("Pong", "Breakout" or an EnvPool id)."""
    from fnrl.algos import dqn

    env_id = GAMES.get(game, game)
    return dataclasses.replace(dqn.Config(), **{**ATARI[variant], "env_id": env_id, **overrides})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(ATARI), default="dqn")
    parser.add_argument("--game", default="Pong", help="Pong, Breakout or any EnvPool Atari id")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()

    from fnrl.train import train

    overrides = {} if args.total_steps is None else {"total_steps": args.total_steps}
    config = atari_config(args.variant, args.game, **overrides)
    result = train(ALGO_NAME[args.variant], config, seed=args.seed, log_dir=args.log_dir, device=args.device,
                   compile=True, threads=None)
    target = TARGETS.get((args.variant, args.game))
    line = f"{args.variant} {config.env_id} seed {args.seed}: return_mean {result.return_mean:.1f}"
    print(line + (f" (CleanRL 10M-step target {target})" if target is not None else ""))


if __name__ == "__main__":
    main()
