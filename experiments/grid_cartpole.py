"""A small grid for `fnrl launch`: PPO and A2C on CartPole, two seeds each, 20k steps.

    fnrl launch experiments/grid_cartpole.py --slots 2
    fnrl plot runs/grid_cartpole --out runs/grid_cartpole/curves.png
"""
GRID = dict(
    algo=["ppo", "a2c"],
    env_id=["CartPole-v1"],
    seed=[0, 1],
    overrides={"total_steps": 20_000},
    args=["--no-compile"],
    root="runs/grid_cartpole",
)
