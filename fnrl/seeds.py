"""Many seeds and hyperparameter settings trained at once in one process (`--num-seeds`, `--sweep`).

A run with `seed=s, num_seeds=K` (and optionally `sweep={FIELD: [v_1, ..., v_V]}`) trains
R = V x K independent *rows*. Row r = (value index i, seed index k) is exactly the single run
`train(..., seed=s + k)` with `FIELD = v_i`:

- its state is `agent_i.init(s + k)`, where `agent_i` is the algorithm bound to the config
  with FIELD = v_i; the R states are stacked into one TensorDict [R, ...];
- its B envs are envs `r*B .. (r+1)*B - 1` of one pool of R x B envs (`make_env`: EnvPool,
  or in-process where a single run of B envs steps in-process), seeded one by one with
  `fnrl.rng.env_seeds(s + k, B)`: the very seeds a single run with seed s + k gives its envs,
  spawned from that seed alone, so no two rows share an env seed;
- acting and the update are `torch.func.vmap`-ed over the row axis
  (`randomness="different"`) and then compiled; the update reads every swept field from
  the state (the algorithm's `SPEC.sweepable` fields), so one compiled function serves all rows.

What is reproducible row by row: the initial state, the env seeds, and the update as a
function of (state, rollout), including PPO's minibatch permutations (drawn from a
generator seeded by the row's seed and env step count, not from the global RNG). What is
not: actions sampled while acting come from the global torch RNG (one draw for all rows),
so after the first sampled action a row's trajectory is a different sample than its single
run's, with the same distribution.

Off-policy algorithms (the DQN family, ddpg / td3 / sac) keep one replay buffer per row
(`fnrl.replay.multi`): row r's buffer holds exactly env columns r*B .. (r+1)*B - 1 of every
rollout, computes n-step returns with the row's own gamma, and keeps its own priorities.
Each update round samples one batch per row ([R, N]) and runs the update vmapped over R;
epsilon / warm-up schedules read each row's own state["env_steps"]. The training loop's
update credit and learning_starts are shared (rows step in lockstep); a round runs once
every row can sample a batch.

R2D1 (recurrent, sequence replay) rows keep their own envs' recurrent carries: the sampler's
carry [R * B] is viewed as [R, B] and acting is vmapped over R with it, so row r's carries
evolve exactly as its single run's. Each row has its own `fnrl.replay.sequence` buffer
(`multi.init_sequence`) fed with `module.sequence_input` of its own columns (input
priorities per row); a round samples one batch of sequences per row ([R, L, N]).

    rows = make_rows(ppo, ppo.Config(), seed=0, num_seeds=4, sweep={"learning_rate": [1e-3, 3e-4]})
    agent = make_agent(ppo, rows, env_spec, num_envs=8, compile=True)
    state = agent.init(0)                 # [8, ...]: the 8 rows' states stacked
    action, extras, _ = agent.act(state, obs, None)     # obs [8 * B, ...] -> action [8 * B]
    state, metrics = agent.update(state, rollout)       # rollout [T, 8 * B]; metrics [8]
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import torch
from tensordict import TensorDict

from fnrl import envs, rng
from fnrl.accel.compiled import act_randomness, ahead_of_time_act, compile_update
from fnrl.accel.options import AccelOptions, resolve
from fnrl.algos.common import Agent
from fnrl.errors import ConfigError
from fnrl.nets.core import vmapped_rows

ALIASES = {"lr": "learning_rate"}
"""Short names accepted by `--sweep` (`lr=1e-4,3e-4` is `learning_rate=1e-4,3e-4`)."""


class Row(NamedTuple):
    """One independent run inside a vmapped run: its seed, its config and its labels
    (the columns that tell it apart in progress.csv: `seed` and any swept field)."""

    seed: int
    config: object
    labels: dict


def parse_sweep(text: str) -> dict:
    """`"FIELD=v1,v2,..."` -> `{"FIELD": [v1, v2, ...]}` (values as floats; dashes in FIELD
    read as underscores, `lr` as `learning_rate`)."""
    field, sep, values = text.partition("=")
    field = field.strip().lstrip("-").replace("-", "_")
    field = ALIASES.get(field, field)
    if not sep or not field or not values.strip():
        raise ConfigError(f"--sweep {text!r}: write FIELD=V1,V2,... (e.g. --sweep learning_rate=1e-4,3e-4)")
    try:
        return {field: [float(v) for v in values.split(",")]}
    except ValueError:
        raise ConfigError(f"--sweep {text!r}: the values must be numbers separated by commas") from None


def supports(module) -> bool:
    """True for algorithms whose update vmaps over rows: on-policy feed-forward (ppo, a2c) and
    off-policy with row replay (the DQN family, ddpg / td3 / sac, and r2d1 with row sequence
    replay); not a central runtime (impala)."""
    spec = module.SPEC
    return spec.runtime == "serial" and (spec.off_policy or bool(spec.sweepable))


def make_rows(module, config, seed: int, num_seeds: int = 1, sweep: dict | None = None) -> list[Row]:
    """The rows of a vmapped run: for each swept value (outer), for each seed s..s+K-1 (inner).

    Raises ConfigError (before any work) for a non-positive num_seeds, an algorithm or
    config that cannot be vmapped, a sweep over a field outside the algorithm's
    `SPEC.sweepable`, or a swept value the algorithm rejects.
    """
    if not isinstance(num_seeds, int) or num_seeds < 1:
        raise ConfigError(f"--num-seeds must be a positive integer, got {num_seeds!r}")
    name = getattr(config, "algo", None) or module.__name__.rsplit(".", 1)[-1]   # qpg: ddpg / td3 / sac
    if not supports(module):
        raise ConfigError(f"--num-seeds / --sweep are not supported for {name} yet; "
                          f"use ppo, a2c, the dqn family, ddpg, td3, sac or r2d1, or separate runs (one per --seed)")
    if not _recurrent(module) and getattr(config, "core", "none") != "none":
        raise ConfigError(f"--num-seeds / --sweep need a feed-forward policy; --core {config.core} is not "
                          f"supported yet (use separate runs)")
    sweep = dict(sweep or {})
    if len(sweep) > 1:
        raise ConfigError(f"--sweep takes one field, got {', '.join(sweep)}; use separate runs for a grid")
    configs = [(config, {})]
    for field, values in sweep.items():
        field = ALIASES.get(field, field)
        if not module.SPEC.sweepable:
            raise ConfigError(f"--sweep: {name} has no sweepable fields yet; use --num-seeds, or separate runs "
                              f"(one per value of --{field.replace('_', '-')})")
        if field not in module.SPEC.sweepable:
            raise ConfigError(f"--sweep {field}: not a sweepable field of {name}; "
                              f"choose one of {', '.join(module.SPEC.sweepable)}")
        values = list(values)
        if not values:
            raise ConfigError(f"--sweep {field}: give at least one value")
        configs = [(dataclasses.replace(config, **{field: type(getattr(config, field))(v)}),
                    {field: type(getattr(config, field))(v)}) for v in values]
    for c, _ in configs:
        module.validate(c)
    return [Row(seed + k, c, {"seed": seed + k, **labels}) for c, labels in configs for k in range(num_seeds)]


def _recurrent(module) -> bool:
    """Recurrent by design (sequence replay, the carry kept by the sampler): r2d1."""
    return module.SPEC.replay == "sequence"


def env_seeds(rows: list[Row], num_envs: int) -> list[int]:
    """Per-env seeds of the pool of len(rows) x num_envs envs: row r's envs get
    `fnrl.rng.env_seeds(rows[r].seed, num_envs)`, as in a single run with seed rows[r].seed."""
    return [s for row in rows for s in rng.env_seeds(row.seed, num_envs)]


def make_env(env_id: str, rows: list[Row], num_envs: int, **kwargs):
    """The pool of len(rows) x num_envs envs, row r's in columns r*B .. (r+1)*B - 1: the envs
    of a single run seeded rows[r].seed (`env_seeds`), on the backend that single run's
    `fnrl.envs.make(env_id, num_envs)` picks (in-process for a few classic-control envs,
    `fnrl.envs.steps_in_process`; EnvPool otherwise). kwargs: the env's constructor's (`fnrl.envs.make`)."""
    backend = "gymnasium" if envs.steps_in_process(env_id, num_envs, kwargs) else "auto"
    return envs.make(env_id, len(rows) * num_envs, seed=env_seeds(rows, num_envs), backend=backend, **kwargs)


def make_agent(module, rows: list[Row], spec, num_envs: int, compile: bool = True,
               accel: AccelOptions | None = None) -> Agent:
    """An `Agent` over R = len(rows) stacked rows, each bound to its own config.

    init(seed) -> state [R, ...]: `agent_r.init(rows[r].seed)` stacked (the argument only
        keeps the Agent signature; the rows carry their seeds).
    act(state [R], obs [R * B, ...], carry, explore) -> (action [R * B], extras [R * B], carry):
        obs is split into [R, B, ...], the algorithm's act vmapped over R, and the
        outputs flattened back, so a sampler sees one batch of R * B envs. carry is None
        for feed-forward algorithms; recurrent ones (r2d1) get the sampler's carry [R * B]
        (with its `reset` [R * B]) viewed as [R, B], each row stepping its own envs'
        carries, and return the next carry [R * B] (fnrl.nets.recurrent's protocol).
    update(state [R], rollout [T, R * B]) -> (state [R], metrics [R]): the rollout is
        viewed as [R, T, B] and the update vmapped over R (`randomness="different"`).
        Off-policy algorithms: update(state [R], batch [R, N]) -> (state [R], metrics [R]),
        one replay sample per row (`fnrl.replay.multi.sample`), the update vmapped over R;
        metrics["priority"] is then [R, N]. Sequence replay (r2d1): batch [R, L, N].
    With `compile=True` act and update are compiled once, with the decisions of a single run
    (`fnrl.accel.compiled`: acting with Inductor's fallback_random; acting ahead of
    time for feed-forward policies where `accel.ahead_of_time`; accel None: from the environment).
    """
    R, B = len(rows), num_envs
    accel = resolve(accel)
    algorithm = module.SPEC
    row_agents = [module.make(row.config, spec) for row in rows]
    base = rows[0].config
    if "batched" in algorithm.make_options:  # the module vmaps (and compiles) the pieces its update sequences
        update_rows = module.make(base, spec, compile=compile, batched=True, ahead_of_time=accel.ahead_of_time).update
    else:
        update_rows = torch.func.vmap(row_agents[0].update, randomness="different")
        if compile:
            update_rows = compile_update(update_rows)
    single_act = row_agents[0].act

    def init(seed: int | None = None):
        return torch.stack([agent.init(row.seed) for agent, row in zip(row_agents, rows)])

    recurrent = _recurrent(module)

    def act_rows(state, obs, carry, explore: bool):
        def one(s, o, c):
            action, extras, next_carry = single_act(TensorDict(s, batch_size=[]), o, c, explore)
            return action, dict(extras), (next_carry if recurrent else ())

        carry = carry.reshape(R, B) if carry is not None else None
        # the state goes in as nested dicts, which vmap batches as a pytree (traceable by torch.export)
        action, extras, carry = torch.func.vmap(one, (0, 0, None if carry is None else 0), randomness="different")(
            state.to_dict(), obs.reshape(R, B, *obs.shape[1:]), carry)
        carry = carry.flatten(0, 1) if recurrent else None
        return action.flatten(0, 1), {k: v.flatten(0, 1) for k, v in extras.items()}, carry

    off_policy = algorithm.off_policy
    eager_act_rows = act_rows
    if compile:
        randomness = act_randomness(algorithm)
        act_rows = _tracing_rows(R, torch.compile(act_rows, fullgraph=True, dynamic=False, options=randomness or None))

    act_keys = algorithm.act_keys

    def act(state, obs, carry=None, explore: bool = True):
        if act_keys is not None:   # fewer tensors for the compiled act to guard (fnrl.accel.compiled.acting_on)
            state = state.select(*act_keys, strict=False)
        return act_rows(state, obs, carry if recurrent else None, explore)

    if compile and not recurrent:   # the sampler's calls ahead of time (fnrl.accel.aot)
        act = ahead_of_time_act(_tracing_rows(R, eager_act_rows), algorithm, act, accel)

    def update(state, rollout):
        if off_policy:  # a replay sample per row: [R, N]
            return update_rows(state, rollout)
        T = rollout.batch_size[0]
        return update_rows(state, rollout.reshape(T, R, B).transpose(0, 1))

    return Agent(init=init, act=act, update=update)


def _tracing_rows(R: int, act_rows: Callable) -> Callable:
    """`act_rows`, traced (where it is compiled) with `fnrl.nets.core.vmapped_rows(R)`: a vmapped
    policy of B envs multiplies R x B rows, and only up to FEW_ROWS of them pay elementwise."""
    def act(*args):
        with vmapped_rows(R):
            return act_rows(*args)

    return act


def sequence_input(module, rows: list[Row], rollout):
    """`module.sequence_input` (r2d1) of each row's env columns of `rollout` [T, R * B] with the
    row's own config, joined back: (rows to store [T, R * B], priority [R * B] or None)."""
    B = rollout.batch_size[1] // len(rows)
    parts = [module.sequence_input(row.config, rollout[:, r * B:(r + 1) * B]) for r, row in enumerate(rows)]
    data = torch.cat([d for d, _ in parts], dim=1)
    priority = None if parts[0][1] is None else torch.cat([p for _, p in parts])
    return data, priority


def metric_rows(metrics, num_rows: int) -> list[dict]:
    """Metrics [R] (a TensorDict of [R] tensors) -> one dict of floats per row."""
    scalars = {k: v for k, v in metrics.items() if torch.is_tensor(v) and v.shape == (num_rows,)}
    table = {k: v.tolist() for k, v in scalars.items()}
    return [{k: vals[r] for k, vals in table.items()} for r in range(num_rows)]
