"""Evaluate a trained policy: greedy / mode actions, full episodes, raw game score.

    returns = evaluate_state("ppo", config, state, episodes=10)      # one-off
    evaluator = Evaluator("ppo", config, episodes=10)                # reusable: env + agent made once
    returns = evaluator(state); evaluator.close()
    evaluation = RunEvaluation("ppo", [config], [seed], episodes=10)  # what train() runs at the end
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import torch

from fnrl import algos, envs, rng
from fnrl.errors import ConfigError
from fnrl.accel.compiled import make_agent
from fnrl.accel.inductor import apply_workarounds
from fnrl.run.checkpoint import config_from_json, load_checkpoint


class Evaluator:
    """Evaluation envs and a non-exploring agent, made once and reused for many evaluations.

    Eval envs are fresh (seeded `seed`: an int s seeds env i with s + i, a list seeds each env),
    `train=False`: no Atari episodic life or reward
    clipping, so returns are the raw game score over whole games. The agent is built
    from `config` (eager unless `compile=True`) and acts with `explore=False` (greedy /
    distribution mode). Each call resets the envs and runs until every env has finished
    ceil(episodes / num_envs) episodes; each env contributes its first finished episodes,
    so short episodes are not favoured. Recurrent policies get their carry reset at
    episode starts, as in the sampler. The torch RNG is forked (when building the agent
    and when evaluating), so evaluation does not change the random stream of the training
    run it is part of.

    record: a list or `fnrl.video.VideoWriter` (anything with `append`) that receives env
        0's frames ([H, W, 3] uint8 RGB, one after the reset and one per step) until
        `record_episodes` of its episodes have ended; the envs are then made with
        `render_mode="rgb_array"` (EnvPool's renderer, or gymnasium's for gymnasium envs).
        `record` may also be set between calls; `render=True` makes envs that can render for it.
    """

    def __init__(self, name: str, config, *, episodes: int = 10, seed: int | list[int] = 10_000,
                 num_envs: int | None = None,
                 device: str = "cpu", compile: bool = False, record: list | None = None, record_episodes: int = 1,
                 render: bool = False):
        if episodes < 1:
            raise ConfigError(f"evaluation needs at least 1 episode, got {episodes}")
        module = algos.load(name)
        self.episodes = episodes
        self.num_envs = num_envs or (len(seed) if isinstance(seed, list) else min(episodes, 8))
        self.device = torch.device(device)
        self.record, self.record_episodes = record, record_episodes
        render = render or record is not None
        kwargs = {**config.env_kwargs, **({"render_mode": "rgb_array"} if render else {})}
        try:
            self.env = envs.make(config.env_id, self.num_envs, seed=seed, train=False, **kwargs)
        except (TypeError, ValueError, RuntimeError) as e:  # an env that takes no render_mode
            if not render:
                raise
            raise ConfigError(f"{config.env_id} cannot render frames for a video: its env takes no "
                              f"render_mode='rgb_array' ({type(e).__name__})") from e
        if compile:
            apply_workarounds()
        with torch.random.fork_rng(devices=[]):  # building networks draws from the RNG
            self.agent = make_agent(module, config, self.env.spec, compile=compile)

    def _frame(self):
        frame = self.env.raw.render()
        if isinstance(frame, (tuple, list)):  # gymnasium vector env: one frame per env
            frame = frame[0]
        frame = np.asarray(frame)
        if frame.ndim == 4:  # EnvPool: [1, H, W, 3] for env 0
            frame = frame[0]
        if frame.ndim != 3 or frame.shape[-1] != 3:
            raise ConfigError(f"{self.env.spec.env_id} cannot render rgb frames for a video")
        return frame.copy()

    def __call__(self, state, episodes: int | None = None, max_steps: int = 1_000_000) -> list[float]:
        """Returns of `episodes` (default: the constructor's) complete episodes of `state`'s policy."""
        episodes = episodes or self.episodes
        n = self.num_envs
        per_env = -(-episodes // n)
        found: list[list[float]] = [[] for _ in range(n)]
        recording = self.record is not None
        recorded = 0
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            obs = self.env.reset()["obs"].to(self.device)
            if recording:
                self.record.append(self._frame())
            carry = None
            for _ in range(max_steps):
                action, _, carry = self.agent.act(state, obs, carry, False)
                out = self.env.step(action)
                obs = out["obs"].to(self.device)
                if carry is not None:  # recurrent: a new episode starts after EnvPool's reset step
                    carry["reset"] = (~out["valid"]).to(self.device)
                if recording:
                    self.record.append(self._frame())
                    recorded += bool(out["episode_end"][0])
                    recording = recorded < self.record_episodes
                for i in torch.nonzero(out["episode_end"]).flatten().tolist():
                    if len(found[i]) < per_env:
                        found[i].append(float(out["episode_return"][i]))
                if not recording and all(len(f) >= per_env for f in found):
                    break
        return [r for f in found for r in f][:episodes]

    def close(self) -> None:
        self.env.close()


def evaluate_state(name: str, config, state, episodes: int = 10, seed: int = 10_000, num_envs: int | None = None,
                   max_steps: int = 1_000_000) -> list[float]:
    """Returns of `episodes` complete episodes of the policy in `state`, without exploration
    (one `Evaluator`, used once; see there)."""
    evaluator = Evaluator(name, config, episodes=episodes, seed=seed, num_envs=num_envs)
    try:
        return evaluator(state, max_steps=max_steps)
    finally:
        evaluator.close()


EVAL_ENVS = 32
"""The most envs a run's evaluation steps at once; up to this many episodes run one per env."""


class RunEvaluation:
    """The deterministic evaluation of a training run: at the end of every run (its final
    evaluation) and, with `interval`, at the first log row at or after every `interval` env steps.

    configs, seeds: the run's rows (one for a single run; a vmapped run's seeds and swept
        settings), each evaluated with its own `Evaluator`: an eager agent of its config acting
        without exploration, on `min(episodes, EVAL_ENVS)` fresh eval envs seeded from the row's
        seed (`fnrl.rng.EVAL_ENV` stream, separate from its training envs), each env
        contributing its first finished episodes.
    __call__(state, env_steps, final) -> one dict per row with `eval_return_mean` and
        `eval_return_std` (population std over the episodes): evaluated where due or `final`,
        NaN otherwise, so progress.csv keeps one header. `state` is the run's state (rows
        stacked along its first dimension for several rows).
    returns: the returns of the latest evaluation of each row (None before the first).
    capture: a folder (`--capture-video`): each evaluation also records the first episode of the
        first row's env 0 there, as `eval-<env steps>.mp4` (`.gif` without imageio-ffmpeg).
    """

    COLUMNS = ("eval_return_mean", "eval_return_std")

    def __init__(self, name: str, configs: list, seeds: list[int], episodes: int = 10, *,
                 interval: int | None = None, start: int = 0, device: str = "cpu", capture=None):
        if interval is not None and (not isinstance(interval, int) or interval < 1):
            raise ConfigError(f"--eval-interval must be a positive number of env steps, got {interval!r}")
        if not isinstance(episodes, int) or episodes < 1:
            raise ConfigError(f"--eval-episodes must be at least 1 (0 turns evaluation off), got {episodes!r}")
        self.interval = interval
        self.next = None if interval is None else start + interval
        self.returns: list[list[float]] | None = None
        self.capture = None if capture is None else Path(capture)
        n = min(episodes, EVAL_ENVS)
        self.evaluators = []
        try:
            for r, (config, seed) in enumerate(zip(configs, seeds)):
                self.evaluators.append(Evaluator(name, config, episodes=episodes, num_envs=n, device=device,
                                                 seed=rng.env_seeds(seed, n, stream=rng.EVAL_ENV),
                                                 render=self.capture is not None and r == 0))
        except BaseException:
            self.close()
            raise

    def due(self, env_steps: int, final: bool = False) -> bool:
        return final or (self.next is not None and env_steps >= self.next)

    def __call__(self, state, env_steps: int, final: bool = False) -> list[dict]:
        if not self.due(env_steps, final):
            return [dict.fromkeys(self.COLUMNS, math.nan) for _ in self.evaluators]
        while self.next is not None and self.next <= env_steps:
            self.next += self.interval
        stacked = state.batch_dims > 0   # a vmapped run's rows
        video = self._video(env_steps)
        with video if video is not None else contextlib.nullcontext():   # the file is finished on success
            self.returns = [evaluator(state[r] if stacked else state) for r, evaluator in enumerate(self.evaluators)]
        self.evaluators[0].record = None
        return [{"eval_return_mean": float(np.mean(r)), "eval_return_std": float(np.std(r))} for r in self.returns]

    def _video(self, env_steps: int):
        if self.capture is None:
            return None
        from fnrl.video import VideoWriter, mp4_available

        self.capture.mkdir(exist_ok=True)
        video = VideoWriter(self.capture / f"eval-{env_steps:09d}.{'mp4' if mp4_available() else 'gif'}")
        self.evaluators[0].record = video
        return video

    def close(self) -> None:
        for evaluator in self.evaluators:
            evaluator.close()


def load_run(path, row: int | None = None):
    """(algo, config, state) of a checkpoint or a policy file (`fnrl export`); for a vmapped run
    (--num-seeds / --sweep), of its row `row` (required when it has several)."""
    ckpt = load_checkpoint(path, policy=True)
    name = ckpt["algo"]
    state = ckpt["state"]
    rows = state.batch_size[0] if state.batch_dims else None
    if rows is None and row not in (None, 0):
        raise ConfigError(f"{path} holds one run; drop --row")
    if rows is not None:
        if row is None or not 0 <= row < rows:
            raise ConfigError(f"{path} holds {rows} vmapped rows (--num-seeds / --sweep); pick one with "
                              f"--row K, K in 0..{rows - 1} (the seed / value order of progress.csv)")
        state = state[row]
    return name, type(algos.default_config(name))(**config_from_json(ckpt["config"])), state


def evaluate_checkpoint(path, episodes: int = 10, seed: int = 10_000, record_video=None, record_episodes: int = 1,
                        fps: float = 30.0, row: int | None = None) -> tuple[str, list[float]]:
    """Load a checkpoint (file or run folder) and evaluate it; returns (algo name, returns).

    row: which row of a vmapped run (--num-seeds / --sweep) to evaluate.
    record_video: a .mp4 (H.264 through imageio-ffmpeg) or .gif (Pillow) path that receives env 0's frames
        (`render_mode="rgb_array"`: EnvPool's renderer, or gymnasium's for gymnasium envs)
        of its first `record_episodes` episodes, at `fps` frames per second.
    """
    if record_video is None:
        name, config, state = load_run(path, row)
        return name, evaluate_state(name, config, state, episodes, seed)
    from fnrl.video import VideoWriter, check_video_path

    check_video_path(record_video)
    if record_episodes < 1:
        raise ConfigError(f"--record-episodes must be at least 1, got {record_episodes}")
    name, config, state = load_run(path, row)
    with VideoWriter(record_video, fps=fps) as video:
        evaluator = Evaluator(name, config, episodes=episodes, seed=seed, record=video,
                              record_episodes=record_episodes)
        try:
            returns = evaluator(state)
        finally:
            evaluator.close()
    return name, returns


def summarize(returns: list[float]) -> str:
    r = np.asarray(returns)
    return f"{len(r)} episodes: return mean {r.mean():.2f} std {r.std():.2f} min {r.min():.2f} max {r.max():.2f}"
