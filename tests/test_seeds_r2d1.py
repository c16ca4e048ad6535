"""Vmapped seeds for R2D1 (fnrl.seeds with recurrent acting + fnrl.replay.multi sequence buffers).

Row k of a vmapped run stands for the single run with seed s + k:
- acting: the sampler's carry [R * B] is viewed as [R, B], so with greedy acting (no sampling
  noise) row k's rollout (actions, Q-values, per-step carries, resets) equals the single run's;
- replay: row k's sequence buffer holds exactly its env columns r*B .. (r+1)*B - 1, with the
  input priorities of its own columns, and equals the single run's buffer;
- the update: row k of the vmapped update on a [R, L, N] sample equals the single run's update
  on batch[k]; priorities go back to row k's buffer only.
"""
import csv
import dataclasses
import math

import pytest
import torch

from fnrl import envs, rng, seeds
from fnrl.algos import r2d1
from fnrl.cli import main
from fnrl.replay import multi, sequence
from fnrl.replay.sum_tree import sum_tree_get
from fnrl.samplers import SerialSampler
from fnrl.train import load_checkpoint, train

CONFIG = dataclasses.replace(r2d1.Config(), burn_in=2, seq_len=4, n_step=2, carry_interval=4, core_size=8,
                             hidden=(8,), head_hidden=8, num_envs=2, num_steps=4, buffer_size=200, batch_size=5,
                             learning_starts=0, eps_init=0.5, eps_final=0.5)
TOL = dict(rtol=1e-5, atol=1e-6)   # a batched matmul may differ from the single run's in the last bit


def options(config):
    return dict(burn_in=config.burn_in, seq_len=config.seq_len, n_step=config.n_step,
                carry_interval=config.carry_interval, prioritized=config.prioritized, alpha=config.priority_alpha)


def assert_close_td(a, b, **kw):
    kw = kw or dict(rtol=0, atol=0)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key, x in a.items(include_nested=True, leaves_only=True):
        torch.testing.assert_close(x, b[key], **kw)


def single_run(config, seed, collects, explore=False):
    """What `train("r2d1", config, seed=seed)` builds: agent, state, its buffer after `collects` collects."""
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    agent = r2d1.make(config, env.spec)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    buffer, rollouts = None, []
    for _ in range(collects):
        rollouts.append(sampler.collect(state, explore=explore).clone())
        data, priority = r2d1.sequence_input(config, rollouts[-1])
        buffer = sequence.add(buffer or sequence.init(data, config.buffer_size, **options(config)), data, priority)
    sampler.close()
    return agent, state, buffer, rollouts


def vmapped_run(config, seed, num_seeds, collects, explore=False, compile=False):
    rows = seeds.make_rows(r2d1, config, seed, num_seeds)
    env = seeds.make_env(config.env_id, rows, config.num_envs)
    agent = seeds.make_agent(r2d1, rows, env.spec, config.num_envs, compile=compile)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    buffers, rollouts = None, []
    for _ in range(collects):
        rollouts.append(sampler.collect(state, explore=explore).clone())
        data, priority = seeds.sequence_input(r2d1, rows, rollouts[-1])
        buffers = multi.add(buffers or multi.init_sequence(data, config.buffer_size, num_rows=len(rows),
                                                           **options(config)), data, priority)
    sampler.close()
    return rows, agent, state, buffers, rollouts


def assert_same_buffer(a, b):
    assert a.spec == b.spec and a.steps_written == b.steps_written
    assert_close_td(a.storage, b.storage, **TOL)
    assert_close_td(a.carry, b.carry, **TOL)
    assert torch.equal(a.slots["sampleable"], b.slots["sampleable"])
    torch.testing.assert_close(a.slots["priority"], b.slots["priority"], **TOL)
    torch.testing.assert_close(a.tree, b.tree, **TOL)


def test_greedy_rows_act_and_store_exactly_the_single_runs_sequences():
    """Row k's initial state, rollouts (carries and resets included; greedy, so no sampling
    noise) and sequence buffer (storage, stored carries, input priorities) are those of the
    single run with seed 3 + k; the carry crosses collects and episode ends (6 collects of
    CartPole with a random policy see some)."""
    rows, agent, state, buffers, rollouts = vmapped_run(CONFIG, seed=3, num_seeds=2, collects=6)
    B = CONFIG.num_envs
    assert buffers.num_rows == 2 and buffers.kind is sequence
    assert any(r["reset"][1:].any() for r in rollouts)  # episodes ended inside the collects
    for k in range(2):
        _, single_state, single_buffer, single_rollouts = single_run(CONFIG, 3 + k, collects=6)
        assert_close_td(state[k], single_state)
        for got, expect in zip(rollouts, single_rollouts):
            assert_close_td(multi.row_columns(got, k, B), expect, **TOL)
        assert_same_buffer(buffers.buffers[k], single_buffer)


def test_row_buffers_hold_their_own_columns_and_row_k_update_equals_the_single_runs():
    rows, agent, state, buffers, rollouts = vmapped_run(CONFIG, seed=0, num_seeds=3, collects=5, explore=True)
    B, T = CONFIG.num_envs, CONFIG.num_steps
    for r in range(3):   # each buffer holds exactly its row's columns, its carries every k rows
        buf = buffers.buffers[r]
        for i, rollout in enumerate(rollouts):
            columns = multi.row_columns(rollout, r, B)
            assert_close_td(buf.storage[i * T:(i + 1) * T], columns.exclude("next_obs", "carry", "q"))
            assert_close_td(buf.carry[i], columns["carry"][0])   # T == carry_interval: one carry per collect
    state["env_steps"] += 5 * T * B
    batch = multi.sample(buffers, CONFIG.batch_size, beta=0.6)
    L = CONFIG.burn_in + CONFIG.seq_len + CONFIG.n_step
    assert batch.batch_size == (3, L, CONFIG.batch_size)
    new_state, metrics = agent.update(state, batch)
    assert metrics.batch_size == (3,) and metrics["priority"].shape == (3, CONFIG.batch_size)
    spec = envs.env_spec(CONFIG.env_id, B)
    for k in range(3):
        single = r2d1.make(CONFIG, spec)
        single_state = single.init(k)
        single_state["env_steps"] += 5 * T * B
        expect, expect_m = single.update(single_state, batch[k])
        assert_close_td(new_state[k], expect, **TOL)
        for key in expect_m.keys():
            torch.testing.assert_close(metrics[key][k], expect_m[key], **TOL)
    # priorities go to each row's own buffer, at the row's own sampled sequences
    before = [b.max_priority.clone() for b in buffers.buffers]
    priority = torch.zeros(3, CONFIG.batch_size)
    priority[1] = 50.0
    buffers = multi.update_priorities(buffers, batch["index"], priority)
    high = torch.tensor(50.0) ** CONFIG.priority_alpha
    torch.testing.assert_close(buffers.buffers[1].max_priority, torch.maximum(before[1], high))
    for r in (0, 2):
        assert torch.equal(buffers.buffers[r].max_priority, before[r])
        assert (sum_tree_get(buffers.buffers[r].tree, batch["index"][r, 0]) < 1e-4).all()
    torch.testing.assert_close(sum_tree_get(buffers.buffers[1].tree, batch["index"][1, 0]).float(),
                               high.expand(CONFIG.batch_size))


def with_reset(carry, reset):
    carry = carry.clone(recurse=False)
    carry["reset"] = reset
    return carry


# Two minutes of compiling on a 2-core machine, left to `-m matrix`: compiled == eager is checked for
# R2D1's single run (tests/test_r2d1.py) and for vmapped DQN and PPO (tests/test_seeds*.py) in CI.
@pytest.mark.slow
@pytest.mark.matrix
def test_compiled_rows_act_and_update_equal_eager_and_do_not_recompile():
    """Acting as the sampler calls it (carry None first, then the returned carry with `reset`)
    and the update, compiled, equal eager; later steps and updates reuse the graphs."""
    rows, eager, state, buffers, rollouts = vmapped_run(CONFIG, seed=0, num_seeds=2, collects=4, explore=True)
    compiled = seeds.make_agent(r2d1, rows, envs.env_spec(CONFIG.env_id, 2 * CONFIG.num_envs), CONFIG.num_envs,
                                compile=True)
    obs, reset = rollouts[-1]["obs"], rollouts[-1]["reset"]
    first, first_eager = compiled.act(state, obs[0], None, False), eager.act(state, obs[0], None, False)
    assert_close_td(first[2], first_eager[2], **TOL)
    carry = with_reset(first[2], reset[1])
    got, expect = compiled.act(state, obs[1], carry, False), eager.act(state, obs[1], carry, False)
    torch.testing.assert_close(got[0], expect[0])
    assert_close_td(got[2], expect[2], **TOL)
    assert_close_td(got[1]["carry"], expect[1]["carry"], **TOL)
    batch = multi.sample(buffers, CONFIG.batch_size)
    new, new_m = compiled.update(state, batch)
    expect_state, expect_m = eager.update(state, batch)
    assert_close_td(new, expect_state, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(new_m["priority"], expect_m["priority"], rtol=1e-4, atol=1e-5)
    compiled.act(state, obs[2], with_reset(got[2], reset[2]), True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        new["env_steps"] += 100
        compiled.update(new, multi.sample(buffers, CONFIG.batch_size))
        compiled.act(new, obs[3], with_reset(got[2], reset[3]), True)


def test_train_num_seeds_logs_a_row_per_seed_and_resumes(tmp_path):
    config = dataclasses.replace(CONFIG, total_steps=64, learning_starts=32, replay_ratio=0.25)
    run = tmp_path / "run"
    result = train("r2d1", config, seed=2, num_seeds=2, log_dir=run, compile=False, quiet=True, tensorboard=False,
                   plot=False, log_interval=32)
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert [(r["env_steps"], r["seed"]) for r in rows] == [(s, seed) for s in ("32", "64") for seed in ("2", "3")]
    assert all(math.isfinite(float(r["loss/q"])) for r in rows[2:])
    # 8 env steps per collect per seed, updates from env step 32: 2 per collect for 5 collects
    assert result.state["updates"].tolist() == [10, 10] and int(rows[-1]["updates"]) == 10
    ckpt = load_checkpoint(run)
    assert ckpt["state"].batch_size == (2,) and ckpt["num_seeds"] == 2
    assert main(["eval", str(run), "--episodes", "1", "--row", "1"]) == 0


def test_sweep_is_refused_in_one_line(capsys, tmp_path):
    argv = ["train", "r2d1", "--num-seeds", "2", "--sweep", "lr=1e-3,1e-4", "--total-steps", "48", "--no-compile",
            "--quiet", "--log-dir", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "r2d1 has no sweepable fields" in err and len(err.splitlines()) == 1
