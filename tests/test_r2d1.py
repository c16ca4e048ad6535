"""Tests for fnrl.algos.r2d1: n-step double-Q targets and sequence priorities against loops,
burn-in without gradient, stored states replayed equal the sampler's, one compiled update,
and an Atari smoke run."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from tensordict import TensorDict

from fnrl import envs
from fnrl.algos import r2d1
from fnrl.envs.spec import EnvSpec
from fnrl.errors import ConfigError
from fnrl.replay import sequence
from fnrl.returns import signed_hyperbolic, signed_parabolic
from fnrl.samplers import SerialSampler

OBS, A = 3, 4
SPEC = EnvSpec("Toy-v0", 2, (OBS,), torch.float32, (), torch.int64, num_actions=A)
TINY = dict(burn_in=3, seq_len=5, n_step=2, carry_interval=4, core_size=8, hidden=(8,), head_hidden=8,
            num_envs=2, num_steps=4, buffer_size=400, batch_size=6, learning_starts=0)


def config(**overrides) -> r2d1.Config:
    return dataclasses.replace(r2d1.Config(), **{**TINY, **overrides})


def make_batch(cfg: r2d1.Config, n: int = 6, seed: int = 0) -> TensorDict:
    """A sequence sample [L, N] with random rows, an episode end at trained row 2 of sequence 0."""
    g = torch.Generator().manual_seed(seed)
    L = cfg.burn_in + cfg.seq_len + cfg.n_step
    done = torch.zeros(L, n, dtype=torch.bool)
    done[cfg.burn_in + 2, 0] = True
    valid = torch.ones(L, n, dtype=torch.bool)
    valid[cfg.burn_in + 3, 0] = False
    carry = TensorDict({"h": torch.randn(n, cfg.core_size, generator=g),
                        "c": torch.randn(n, cfg.core_size, generator=g)}, batch_size=[n])
    return TensorDict({
        "obs": torch.randn(L, n, OBS, generator=g),
        "action": torch.randint(0, A, (L, n), generator=g),
        "reward": torch.randn(L, n, generator=g),
        "terminated": done.clone(),
        "done": done,
        "valid": valid,
        "reset": torch.zeros(L, n, dtype=torch.bool),
        "mask": sequence.trained_mask(valid, done, cfg.burn_in, cfg.seq_len),
        "weight": (torch.rand(n, generator=g) + 0.5).expand(L, n),
        "index": torch.arange(n).expand(L, n),
        "carry": carry.expand(L, n),
    }, batch_size=[L, n])


def flat(td: TensorDict) -> dict:
    return td.flatten_keys(".").to_dict()


# ---------------------------------------------------------------------------
# targets and priorities
# ---------------------------------------------------------------------------


def test_n_step_double_q_targets_match_loop():
    g = torch.Generator().manual_seed(1)
    Tp, N, n, gamma, T = 9, 5, 3, 0.9, 6
    q_online, q_target = torch.randn(Tp, N, A, generator=g), torch.randn(Tp, N, A, generator=g)
    reward = torch.randn(Tp, N, generator=g)
    done = torch.rand(Tp, N, generator=g) < 0.2
    terminated = done & (torch.rand(Tp, N, generator=g) < 0.5)
    h = lambda x: signed_hyperbolic(x, 1e-3)
    h_inv = lambda x: signed_parabolic(x, 1e-3)
    target, row = r2d1.n_step_double_q_targets(q_online, q_target, reward, terminated, done, gamma, n, T, h, h_inv)
    for t in range(T):
        for b in range(N):
            ret, disc, m = 0.0, 1.0, n
            for k in range(n):
                ret += disc * float(reward[t + k, b])
                disc *= gamma * (not terminated[t + k, b])
                if done[t + k, b]:
                    m = k + 1
                    break
            best = int(q_online[t + m, b].argmax())
            y = float(h(torch.tensor(ret + disc * float(h_inv(q_target[t + m, b, best])))))
            assert int(row[t, b]) == t + m
            assert abs(float(target[t, b]) - y) < 1e-5


def test_sequence_priority_hand_values():
    td_abs = torch.tensor([[1.0, 4.0], [3.0, 9.0], [2.0, 1.0]])
    mask = torch.tensor([[True, True], [True, False], [False, True]])
    # env 0: rows 1, 3 -> max 3, mean 2 -> 0.9 * 3 + 0.1 * 2; env 1: rows 4, 1 -> max 4, mean 2.5
    torch.testing.assert_close(r2d1.sequence_priority(td_abs, mask, 0.9), torch.tensor([2.9, 3.85]))


def test_input_priorities_use_the_actors_q_values():
    cfg = config(n_step=1, value_rescale=False, gamma=0.5, priority_eta=0.5)
    T, B = 3, 1
    q = torch.tensor([[[1.0, 0.0]], [[2.0, 4.0]], [[0.0, 1.0]]])                      # [T, B, 2]
    rollout = TensorDict({"q": q, "action": torch.tensor([[0], [1], [0]]), "reward": torch.tensor([[1.0], [2.0], [0.0]]),
                          "terminated": torch.zeros(T, B, dtype=torch.bool), "done": torch.zeros(T, B, dtype=torch.bool),
                          "valid": torch.ones(T, B, dtype=torch.bool)}, batch_size=[T, B])
    data, priority = r2d1.sequence_input(cfg, rollout)
    assert "q" not in data.keys()
    # row 0: |1 - (1 + .5 * 4)| = 2; row 1: |4 - (2 + .5 * 1)| = 1.5; row 2 bootstraps past the rollout
    torch.testing.assert_close(priority, torch.tensor([0.5 * 2.0 + 0.5 * 1.75]))


# ---------------------------------------------------------------------------
# burn-in, masks, loss
# ---------------------------------------------------------------------------


def test_burn_in_carries_no_gradient_but_sets_the_state():
    cfg = config()
    agent_fns = r2d1.functions(cfg, SPEC)
    state = r2d1.make(cfg, SPEC).init(0)
    batch = make_batch(cfg)

    def loss_of_obs(obs):
        b = batch.clone()
        b["obs"] = obs
        return agent_fns.loss(state["params"], state["target_params"], b)[0]

    grad = torch.func.grad(loss_of_obs)(batch["obs"])
    assert (grad[:cfg.burn_in] == 0).all()
    assert grad[cfg.burn_in:cfg.burn_in + cfg.seq_len].abs().sum() > 0
    moved = batch["obs"].clone()
    moved[:cfg.burn_in] += 1.0
    assert not torch.allclose(loss_of_obs(moved), loss_of_obs(batch["obs"]))   # the burn-in does matter

    grads = torch.func.grad(lambda p: agent_fns.loss(p, state["target_params"], batch)[0])(state["params"])
    assert all(v.abs().sum() > 0 for v in grads.values(include_nested=True, leaves_only=True))


def test_masked_rows_do_not_enter_the_loss():
    cfg = config()
    fns = r2d1.functions(cfg, SPEC)
    state = r2d1.make(cfg, SPEC).init(0)
    batch = make_batch(cfg)
    base, metrics = fns.loss(state["params"], state["target_params"], batch)
    changed = batch.clone()
    changed["reward"][cfg.burn_in + 4, 0] += 100.0        # after the done at trained row 2 of sequence 0
    changed["action"][cfg.burn_in + 3, 0] = (changed["action"][cfg.burn_in + 3, 0] + 1) % A
    torch.testing.assert_close(fns.loss(state["params"], state["target_params"], changed)[0], base)
    assert (metrics["td_abs"][3:, 0] == 0).all() and metrics["priority"].shape == (6,)


# ---------------------------------------------------------------------------
# stored states replayed equal the sampler's
# ---------------------------------------------------------------------------


def test_stored_states_replayed_equal_the_samplers():
    cfg = config(env_id="CartPole-v1", num_envs=3, num_steps=6, burn_in=4, seq_len=6, n_step=2, carry_interval=4,
                 core_size=16, hidden=(16,), eps_init=0.5, eps_final=0.5)
    env = envs.make(cfg.env_id, cfg.num_envs, seed=0)
    agent = r2d1.make(cfg, env.spec)
    state = agent.init(0)
    sampler = SerialSampler(env, agent.act, cfg.num_steps)
    rollouts = []
    buffer = None
    for _ in range(12):                                   # 72 rows per env, episodes of ~10-40 steps end inside
        rollout = sampler.collect(state).clone()
        rollouts.append(rollout)
        data, priority = r2d1.sequence_input(cfg, rollout)
        if buffer is None:
            buffer = sequence.init(data, 3 * 48, burn_in=cfg.burn_in, seq_len=cfg.seq_len, n_step=cfg.n_step,
                                   carry_interval=cfg.carry_interval, prioritized=True)
        buffer = sequence.add(buffer, data, priority)
    env.close()
    history = torch.cat(rollouts)                         # [72, B]
    assert history["reset"][1:].any()
    batch = sequence.sample(buffer, 8, generator=torch.Generator().manual_seed(0))
    env_index = batch["index"][0] % cfg.num_envs
    W, C = 72, 48                                         # ring position -> absolute row
    slot = batch["index"][0] // cfg.num_envs
    first = slot * cfg.carry_interval + C * ((W - 1 - slot * cfg.carry_interval) // C)
    rows = first + torch.arange(batch.shape[0]).unsqueeze(1)
    # the stored carry is the carry the sampler's act started that row from
    stored = history["carry"][first, env_index]
    torch.testing.assert_close(batch["carry"][0].to_dict(), stored.to_dict(), rtol=0, atol=0)
    torch.testing.assert_close(batch["reset"], history["reset"][rows, env_index])
    # replaying the sequence from it (burn-in included, resets inside) gives the actor's own Q-values
    fns = r2d1.functions(cfg, env.spec)
    q = fns.q_sequence(state["params"], batch)
    torch.testing.assert_close(q, history["q"][rows[cfg.burn_in:], env_index], rtol=1e-5, atol=1e-5)
    assert history["reset"][rows, env_index].any(), "the sampled sequences should cross an episode start"


# ---------------------------------------------------------------------------
# validation, one compiled update, Atari smoke
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, match", [
    (dict(core="rnn"), "--core"),
    (dict(buffer_size=20), "raise --buffer-size"),
    (dict(priority_eta=1.5), "--priority-eta"),
    (dict(burn_in=-1), "--burn-in"),
])
def test_invalid_settings_raise_one_line_config_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        r2d1.validate(config(**overrides))


def test_compiled_update_equals_eager_and_does_not_recompile():
    cfg = config(target_update_interval=2, burn_in=1, seq_len=4, n_step=1)   # short unrolls: compile in ~1 min
    agent = r2d1.make(cfg, SPEC)
    compiled = torch.compile(agent.update, fullgraph=True)
    eager_state = agent.init(0)
    compiled_state = eager_state.clone()
    for i in range(3):
        batch = make_batch(cfg, seed=i)
        eager_state, eager_m = agent.update(eager_state, batch)
        with torch.compiler.set_stance("fail_on_recompile" if i > 0 else "default"):
            compiled_state, compiled_m = compiled(compiled_state, batch)
        torch.testing.assert_close(flat(compiled_m), flat(eager_m), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(flat(compiled_state), flat(eager_state), rtol=1e-4, atol=1e-5)


def test_atari_smoke_a_few_updates_on_pong(tmp_path):
    pytest.importorskip("envpool")
    from fnrl.train import train

    cfg = config(env_id="Pong-v5", total_steps=96, num_envs=2, num_steps=8, burn_in=2, seq_len=4, n_step=2,
                 carry_interval=4, buffer_size=2 * 48, batch_size=2, learning_starts=48, replay_ratio=0.05,
                 core_size=16, head_hidden=16)
    result = train("r2d1", cfg, seed=0, log_dir=tmp_path / "run", compile=False, quiet=True, plot=False,
                   tensorboard=False, eval_episodes=0)   # whole Pong games: minutes
    assert result.history[-1]["updates"] >= 2
    assert torch.isfinite(torch.tensor(result.history[-1]["loss/q"]))
