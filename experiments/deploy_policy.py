"""Run an exported policy with plain torch (or onnxruntime) and gymnasium; fnrl is not imported.

    fnrl train ppo                                  # CartPole-v1, into runs/ppo-CartPole-v1-s0-...
    fnrl export runs/ppo-CartPole-v1-s0-... --format pt2
    python experiments/deploy_policy.py runs/ppo-CartPole-v1-s0-.../policy.pt2 --env CartPole-v1

A `.pt2` file runs through `torch.export.load`, a `.onnx` file through onnxruntime. The policy
takes a batch of raw observations (its normalization is inside) and returns the actions the env
takes. Prints each episode's return and their mean.
"""
import argparse

import gymnasium as gym
import numpy as np


def load(path: str):
    """obs [N, *obs_shape] (numpy) -> actions [N, ...] (numpy)."""
    if path.endswith(".onnx"):
        import onnxruntime

        session = onnxruntime.InferenceSession(path)
        name = session.get_inputs()[0].name
        return lambda obs: session.run(None, {name: obs})[0]
    import torch

    policy = torch.export.load(path).module()
    return lambda obs: policy(torch.from_numpy(obs)).numpy()


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", help="policy.pt2 or policy.onnx (fnrl export RUN --format pt2|onnx)")
    parser.add_argument("--env", default="CartPole-v1", help="gymnasium env id (default: CartPole-v1)")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    policy, env = load(args.policy), gym.make(args.env)
    returns = []
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=args.seed + episode)
        total, done = 0.0, False
        while not done:
            batch = np.asarray(obs)[None]
            action = policy(batch.astype(np.float32) if batch.dtype == np.float64 else batch)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        print(f"episode {episode}: return {total:.1f}")
    print(f"mean return {np.mean(returns):.1f}")
    return float(np.mean(returns))


if __name__ == "__main__":
    main()
