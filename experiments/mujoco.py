"""CleanRL's MuJoCo settings for DDPG, TD3 and SAC, as `fnrl.algos.qpg.Config` overrides.

CleanRL (Huang et al. 2022, JMLR 23(274)) uses one set of hyperparameters for every
MuJoCo task: `ddpg_continuous_action.py`, `td3_continuous_action.py` and
`sac_continuous_action.py`, 1M steps, 256-256 networks, batch 256, one update per env step.
Its reported 1M-step returns (SAC / TD3): HalfCheetah ~9,635 / ~9,583.

    python experiments/mujoco.py sac HalfCheetah-v4 --seed 1 --total-steps 1000000
    # or from the command line: fnrl train sac --env HalfCheetah-v4 --learning-starts 5000 ...

Notes on the mapping:
- CleanRL's SAC updates the actor twice every second step (policy_frequency 2 with a
  compensating loop); fnrl's `policy_delay=1` (one actor update per critic update) is the
  same rate. Its temperature starts at alpha = 1 (log alpha = 0) and uses the critic's
  learning rate, as here.
- CleanRL's DDPG and TD3 update actor and targets every second step (policy_frequency 2).
"""
from __future__ import annotations

import argparse
import dataclasses

ENVS = ("HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Ant-v4")

COMMON = dict(total_steps=1_000_000, buffer_size=1_000_000, batch_size=256, gamma=0.99, tau=0.005,
              num_envs=1, num_steps=1, replay_ratio=1.0, n_step=1, hidden=(256, 256))

SETTINGS: dict[str, dict] = {
    "sac": dict(COMMON, algo="sac", num_critics=2, learning_starts=5_000, actor_lr=3e-4, critic_lr=1e-3,
                alpha_lr=1e-3, policy_delay=1, autotune=True, alpha_init=1.0, alpha=0.2),
    "td3": dict(COMMON, algo="td3", num_critics=2, learning_starts=25_000, actor_lr=3e-4, critic_lr=3e-4,
                policy_delay=2, exploration_noise=0.1, policy_noise=0.2, noise_clip=0.5),
    "ddpg": dict(COMMON, algo="ddpg", num_critics=1, learning_starts=25_000, actor_lr=3e-4, critic_lr=3e-4,
                 policy_delay=2, exploration_noise=0.1, policy_noise=0.0),
}
"""CleanRL's defaults per algorithm; the same for every MuJoCo env."""

CLEANRL_1M_RETURNS = {("sac", "HalfCheetah-v4"): 9635, ("td3", "HalfCheetah-v4"): 9583}
"""Returns CleanRL reports after 1M steps (targets, not guarantees)."""


def config(algo: str, env_id: str, **overrides):
    """The qpg Config for `algo` on `env_id` with CleanRL's settings (and `overrides`)."""
    from fnrl.algos import default_config

    if algo not in SETTINGS:
        raise ValueError(f"algo must be one of {', '.join(SETTINGS)}, got {algo!r}")
    return dataclasses.replace(default_config(algo), env_id=env_id, **{**SETTINGS[algo], **overrides})


def main(argv=None):
    from fnrl.train import train

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algo", choices=sorted(SETTINGS))
    parser.add_argument("env_id", choices=ENVS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args(argv)
    cfg = config(args.algo, args.env_id, total_steps=args.total_steps)
    result = train(args.algo, cfg, seed=args.seed, log_dir=args.log_dir, device=args.device,
                   compile=not args.no_compile)
    print(f"{args.algo} {args.env_id} seed {args.seed}: return {result.return_mean:.1f} ({result.log_dir})")


if __name__ == "__main__":
    main()
