"""`fnrl export RUN`: a trained agent as a file to share or deploy.

    path = export_policy("runs/ppo-CartPole-v1-s0")                 # -> RUN/policy.pt (fnrl's)
    path = export_policy("runs/ppo-CartPole-v1-s0", format="pt2")   # -> RUN/policy.pt2 (plain torch)
    path = export_policy("runs/ppo-CartPole-v1-s0", format="onnx")  # -> RUN/policy.onnx (onnxruntime)

`policy` (the default): fnrl's policy file. It holds the algorithm, its Config as JSON and, of
the trained state, only what acting reads (parameters, observation normalizers; every vmapped
row of a --num-seeds run): no optimizer moments, target networks, replay or RNG states. It is
plain data, read without running code from it (`fnrl.run.checkpoint.policy_payload`), a
fraction of the checkpoint's size, and `fnrl eval` takes it as it takes a checkpoint.

`pt2` / `onnx`: the deterministic policy (`act(explore=False)`: the greedy action, the
distribution's mode, the deterministic actor's output) as a standalone program of any batch
size, with the observation normalization of the run inside it and the parameters as constants:

    action = torch.export.load("policy.pt2").module()(obs)          # obs [N, *obs_shape] -> action
    session = onnxruntime.InferenceSession("policy.onnx")
    action = session.run(None, {session.get_inputs()[0].name: obs})[0]

`obs` is a batch of raw observations as the env returns them (its dtype: float32 for vector
observations, uint8 for Atari frames; images channels-first, as fnrl's env adaptor gives them, so
an env's channels-last frames need `obs.transpose(0, 3, 1, 2)` first);
`action` is what the env's `step` takes: int64 [N] for discrete actions, int64 [N, K] for
multi-discrete ones, float32 [N, D] for continuous ones (SAC / TD3 / DDPG: within the env's
bounds; PPO: the Gaussian's mean, which the env clips). Neither file needs fnrl to run. The
programs serve feed-forward policies of tensor observations; a recurrent policy (`--core`, R2D1)
or Dict observations are refused with one line. `onnx` needs the `onnx` and `onnxscript`
packages (`pip install "fnrl[export]"`).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from fnrl import algos
from fnrl.errors import ConfigError
from fnrl.files import replacing
from fnrl.run.checkpoint import CHECKPOINT, load_checkpoint, policy_payload, save_checkpoint

POLICY = "policy.pt"
"""The policy file's default name, in the run folder."""

FORMATS = {"policy": ".pt", "pt2": ".pt2", "onnx": ".onnx"}
"""Export formats and the suffix of each one's default file name (`policy` + suffix)."""


def export_policy(run, out=None, format: str = "policy", row: int | None = None) -> Path:
    """Write the run folder's (or checkpoint's) policy in `format` (see the module docstring) to
    `out` (default: `policy.pt` / `policy.pt2` / `policy.onnx` beside the checkpoint); returns its
    path. row: which row of a vmapped run the pt2 / onnx program serves (required when it has
    several; a policy file keeps every row). ConfigError for what cannot be exported."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}; use one of: {', '.join(FORMATS)}")
    folder = Path(run) if Path(run).is_dir() else Path(run).parent
    out = Path(out) if out is not None else folder / f"policy{FORMATS[format]}"
    if out.name == CHECKPOINT and out.parent.resolve() == folder.resolve():
        raise ConfigError(f"--out {out} would overwrite the run's checkpoint; choose another file")
    if not out.parent.is_dir():
        raise ConfigError(f"the folder of --out {out} does not exist; create it or choose another path")
    if format == "onnx" and not all(importlib.util.find_spec(m) for m in ("onnx", "onnxscript")):
        raise ConfigError('--format onnx needs the onnx and onnxscript packages: pip install "fnrl[export]"')
    if format == "policy":
        if row is not None:
            raise ConfigError("a policy file keeps every row of a vmapped run; drop --row")
        ckpt = load_checkpoint(run)
        module = algos.load(ckpt["algo"])
        save_checkpoint(out, policy_payload(ckpt["algo"], ckpt["config"], ckpt["state"], module.SPEC.act_keys))
        return out
    program = policy_program(run, row)
    with replacing(out) as tmp:
        if format == "pt2":
            torch.export.save(program, tmp)
        else:
            _to_onnx(program).save(str(tmp))
    return out


def _to_onnx(program: torch.export.ExportedProgram):
    """The program in ONNX (torch's dynamo exporter), without the exporter's notes about
    operator libraries the policy does not use."""
    import logging
    import warnings

    quiet = logging.getLogger("torch.onnx._internal.exporter._registration")
    level, quiet.level = quiet.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.onnx.export(program, dynamo=True, verbose=False, report=False)
    finally:
        quiet.setLevel(level)


class _Deterministic(torch.nn.Module):
    """`act(state, obs, None, explore=False)`'s action as a module of `obs` alone; the state's
    acting entries are its buffers."""

    def __init__(self, act, state):
        super().__init__()
        self.act, self.keys, self.batch_size = act, list(state.keys(include_nested=True, leaves_only=True)), \
            state.batch_size
        for i, key in enumerate(self.keys):
            self.register_buffer(f"state_{i}", state.get(key).detach().clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        from tensordict import TensorDict

        state = TensorDict({k: getattr(self, f"state_{i}") for i, k in enumerate(self.keys)},
                           batch_size=self.batch_size)
        action, _, _ = self.act(state, obs, None, False)
        return action


def policy_program(run, row: int | None = None) -> torch.export.ExportedProgram:
    """The deterministic policy of a run folder, checkpoint or policy file as a
    `torch.export` program `obs [N, *obs_shape] -> action`, N dynamic (module docstring)."""
    from fnrl import envs
    from fnrl.evaluate import load_run
    from fnrl.nets.core import plain_products

    name, config, state = load_run(run, row)
    if getattr(config, "core", "none") != "none":
        raise ConfigError(f"{name} with a recurrent core ({config.core}) carries a state between steps; export "
                          "serves feed-forward policies (use the policy file: --format policy)")
    module = algos.load(name)
    spec = envs.env_spec(config.env_id, 1, **config.env_kwargs)
    if isinstance(spec.obs_shape, dict):
        raise ConfigError(f"{spec.env_id} has Dict observations; export serves tensor observations (use the policy "
                          "file: --format policy)")
    agent = module.make(config, spec)
    keys = module.SPEC.act_keys
    acting = state.select(*keys, strict=False) if keys is not None else state
    policy = _Deterministic(agent.act, acting).eval()
    example = torch.zeros((2, *spec.obs_shape), dtype=spec.obs_dtype)
    batch = torch.export.Dim("batch", min=1)
    with plain_products(), torch.no_grad():
        return torch.export.export(policy, (example,), dynamic_shapes=({0: batch},), strict=False)
