"""A user's own env in a module that registers it when imported, as gymnasium's
`module:Env-v0` form expects: `fnrl train ppo --env tests.user_env:UserCount-v0`."""
import gymnasium as gym

from tests.helpers import CountEnv

if "UserCount-v0" not in gym.registry:
    gym.register("UserCount-v0", entry_point=CountEnv, max_episode_steps=20)
