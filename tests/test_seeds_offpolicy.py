"""Vmapped seeds and sweeps for off-policy algorithms (fnrl.seeds + fnrl.replay.multi).

Row k of a vmapped run stands for the single run with seed s + k: same initial state, same
env seeds, its own replay buffer holding exactly its own env columns, and the same update.
What is compared:
- greedy collects (no sampling noise): row k's rollout and replay buffer equal the single
  run's, tensor for tensor;
- sampling: with eager draws, row k's batch is the batch the single run's buffer gives when
  the global RNG is at the state row k's draw starts from (rows draw in order);
- the update: row k of the vmapped update equals the single run's update on row k's batch
  (DQN, rainbow, DDPG are deterministic given the batch; SAC draws actions inside its update,
  so it is compared with its noise fixed, and rows are checked to draw noise of their own).
"""
import csv
import dataclasses
import math

import pytest
import torch

from fnrl import envs, replay, rng, seeds
from fnrl.algos import default_config, dqn, impala, qpg
from fnrl.cli import main
from fnrl.distributions import tanh_normal_log_prob
from fnrl.errors import ConfigError
from fnrl.replay import multi
from fnrl.samplers import SerialSampler
from fnrl.train import load_checkpoint, save_checkpoint, train

DQN = dqn.Config(num_envs=3, num_steps=8, buffer_size=300, batch_size=16, learning_starts=0, total_steps=400,
                 hidden=(32, 32))
RAINBOW = dataclasses.replace(DQN, **{**dqn.VARIANTS["rainbow"], "num_atoms": 11})
DDPG = dataclasses.replace(default_config("ddpg"), num_envs=3, buffer_size=300, batch_size=16, learning_starts=0,
                           num_steps=8, hidden=(32, 32), total_steps=400)
SAC = dataclasses.replace(DDPG, **qpg.VARIANTS["sac"])


def assert_equal_td(a, b, **kw):
    kw = kw or dict(rtol=0, atol=0)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key, x in a.items(include_nested=True, leaves_only=True):
        torch.testing.assert_close(x, b[key], **kw)


def assert_same_buffer(a, b, **kw):
    """Same spec, rows, priorities and sum tree; storage equal (within kw: continuous actions
    of a batched matmul may differ from the single run's in the last bit, and so the states)."""
    assert a.spec == b.spec and a.steps_written == b.steps_written
    assert_equal_td(a.storage, b.storage, **kw)
    assert_equal_td(a.rows, b.rows)
    torch.testing.assert_close(a.tree, b.tree, rtol=0, atol=0)
    torch.testing.assert_close(a.sampleable_count, b.sampleable_count, rtol=0, atol=0)


def init_replay(config, rollout, num_rows=None, gammas=None):
    options = dict(n_step=config.n_step, prioritized=config.prioritized, alpha=config.priority_alpha)
    if num_rows is None:
        return replay.init(rollout, config.buffer_size, gamma=config.gamma, **options)
    return multi.init(rollout, config.buffer_size, num_rows=num_rows, gamma=gammas or config.gamma, **options)


def single_run(module, config, seed, collects, explore=False):
    """What `train(..., seed=seed)` builds: agent, initial state, and its buffer after `collects` collects."""
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    agent = module.make(config, env.spec)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    buffer = None
    for _ in range(collects):
        rollout = sampler.collect(state, explore=explore)
        buffer = replay.add(buffer or init_replay(config, rollout), rollout)
    return agent, state, buffer, rollout


def vmapped_run(module, config, seed, num_seeds, collects, explore=False, sweep=None, compile=False):
    rows = seeds.make_rows(module, config, seed, num_seeds, sweep)
    env = seeds.make_env(config.env_id, rows, config.num_envs)
    agent = seeds.make_agent(module, rows, env.spec, config.num_envs, compile=compile)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    buffers, rollouts = None, []
    for _ in range(collects):
        rollouts.append(sampler.collect(state, explore=explore).clone())
        buffers = multi.add(buffers or init_replay(config, rollouts[-1], len(rows), [r.config.gamma for r in rows]),
                            rollouts[-1])
    return rows, agent, state, buffers, rollouts


@pytest.mark.parametrize("module,config", [(dqn, RAINBOW), (qpg, DDPG)])
def test_greedy_rows_store_exactly_the_single_runs_replay(module, config):
    """Initial state, env seeds, acting and the replay (storage, priorities, sum tree) of row k
    are those of the single run with seed 3 + k (greedy acting: no sampling noise); bit for bit
    with discrete actions, to float rounding with continuous ones."""
    rows, agent, state, buffers, _ = vmapped_run(module, config, seed=3, num_seeds=3, collects=3)
    assert buffers.num_rows == 3
    for k in range(3):
        _, single_state, single_buffer, _ = single_run(module, config, 3 + k, collects=3)
        assert_equal_td(state[k], single_state)
        assert_same_buffer(buffers.buffers[k], single_buffer, **({} if module is dqn else dict(rtol=1e-5, atol=1e-5)))


def test_row_buffers_hold_their_own_env_columns_and_sample_from_them():
    rows, agent, state, buffers, rollouts = vmapped_run(dqn, RAINBOW, seed=0, num_seeds=2, collects=2, explore=True)
    B, T = RAINBOW.num_envs, RAINBOW.num_steps
    for r in range(2):
        for i, rollout in enumerate(rollouts):
            stored = buffers.buffers[r].storage[i * T:(i + 1) * T]
            assert_equal_td(stored, multi.row_columns(rollout, r, B).exclude("next_obs"))
    torch.manual_seed(11)
    batch = multi.sample(buffers, 32, beta=0.5)
    assert batch.batch_size == (2, 32)
    torch.manual_seed(11)  # rows draw one after the other from the global RNG, as the single runs would
    for r in range(2):
        expect = replay.sample(buffers.buffers[r], 32, beta=0.5)
        assert_equal_td(batch[r], expect)
        position, env = batch[r]["index"] // B, batch[r]["index"] % B
        torch.testing.assert_close(batch[r]["obs"], buffers.buffers[r].storage["obs"][position, env])
    # priorities of row 1 only move row 1's tree
    trees = [b.tree.clone() for b in buffers.buffers]
    td = torch.stack([torch.zeros(32), torch.full((32,), 5.0)])
    buffers = multi.update_priorities(buffers, batch["index"], td)
    assert torch.equal(buffers.buffers[0].tree[-buffers.buffers[0].spec.capacity:].count_nonzero(),
                       trees[0][-buffers.buffers[0].spec.capacity:].count_nonzero())
    assert not torch.equal(buffers.buffers[1].tree, trees[1])
    assert buffers.buffers[1].max_priority > buffers.buffers[0].max_priority


@pytest.mark.parametrize("module,config", [(dqn, DQN), (dqn, RAINBOW), (qpg, DDPG)])
def test_first_update_of_row_k_equals_single_run_on_its_batch(module, config):
    rows, agent, state, buffers, _ = vmapped_run(module, config, seed=0, num_seeds=3, collects=2, explore=True)
    state["env_steps"] += 2 * config.num_steps * config.num_envs
    batch = multi.sample(buffers, config.batch_size, beta=0.4)
    new_state, metrics = agent.update(state, batch)
    assert metrics.batch_size == (3,)
    if config.prioritized:
        assert metrics["priority"].shape == (3, config.batch_size)
    spec = envs.env_spec(config.env_id, config.num_envs)
    for k in range(3):
        single = module.make(config, spec)
        single_state = single.init(k)
        single_state["env_steps"] += 2 * config.num_steps * config.num_envs
        expect, expect_m = single.update(single_state, batch[k])
        assert_equal_td(new_state[k], expect, rtol=1e-5, atol=1e-6)
        for key in expect_m.keys():
            torch.testing.assert_close(metrics[key][k], expect_m[key], rtol=1e-5, atol=1e-6)


def fixed_noise_sample(mean, log_std):
    """tanh_normal_sample with the noise fixed at e = 0.5 (still differentiable in mean and log_std)."""
    pre_tanh = mean + log_std.exp() * 0.5
    return torch.tanh(pre_tanh), tanh_normal_log_prob(mean, log_std, pre_tanh)


def test_sac_rows_equal_single_runs_with_the_noise_fixed_and_draw_their_own_noise(monkeypatch):
    """SAC draws actions inside its update, so row k and the single run differ by their noise.
    With the noise fixed, row k's update is the single run's; with noise, rows draw their own."""
    rows, agent, state, buffers, _ = vmapped_run(qpg, SAC, seed=4, num_seeds=2, collects=2)
    batch = multi.sample(buffers, SAC.batch_size)
    same = torch.stack([state[0], state[0]])
    noisy, _ = agent.update(same, torch.stack([batch[0], batch[0]]))   # one state and batch, two rows
    assert not torch.equal(noisy[0]["params", "critic", "body", "0", "weight"],
                           noisy[1]["params", "critic", "body", "0", "weight"])
    monkeypatch.setattr(qpg, "tanh_normal_sample", fixed_noise_sample)
    agent = seeds.make_agent(qpg, rows, envs.env_spec(SAC.env_id, 2 * SAC.num_envs), SAC.num_envs, compile=False)
    new_state, metrics = agent.update(state, batch)
    spec = envs.env_spec(SAC.env_id, SAC.num_envs)
    for k in range(2):
        expect, expect_m = qpg.make(SAC, spec).update(qpg.make(SAC, spec).init(4 + k), batch[k])
        assert_equal_td(new_state[k], expect, rtol=1e-5, atol=1e-6)
        for key in expect_m.keys():
            torch.testing.assert_close(metrics[key][k], expect_m[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("module,config,field,values", [
    (dqn, DQN, "learning_rate", [1e-2, 1e-4]),
    (qpg, SAC, "critic_lr", [1e-2, 1e-4]),
    (dqn, DQN, "gamma", [0.5, 0.99]),
])
def test_sweep_rows_equal_single_runs_with_that_value(module, config, field, values):
    rows, agent, state, buffers, _ = vmapped_run(module, config, seed=0, num_seeds=1, collects=2,
                                                 sweep={field: values})
    for r, v in enumerate(values):
        assert buffers.buffers[r].spec.gamma == (v if field == "gamma" else config.gamma)
    batch = multi.sample(buffers, config.batch_size)
    if module is qpg:  # SAC's update draws noise: compare the critic step only through its rate
        changes = []
        new_state, _ = agent.update(state, batch)
        for r in range(2):
            diff = new_state[r]["params", "critic"] - state[r]["params", "critic"]
            changes.append(max(x.abs().max() for x in diff.values(True, True)))
        assert changes[0] > 10 * changes[1]
        rates = state["opt_state"].flatten_keys(".")["1.critic"]  # in the parameters' dtype
        assert rates.dtype == torch.float32 and rates.tolist() == torch.tensor(values).tolist()
        return
    new_state, _ = agent.update(state, batch)
    spec = envs.env_spec(config.env_id, config.num_envs)
    for r, v in enumerate(values):
        single = module.make(dataclasses.replace(config, **{field: v}), spec)
        expect, _ = single.update(single.init(0), batch[r])
        assert_equal_td(new_state[r], expect, rtol=1e-5, atol=1e-6)
    if field == "gamma":  # the row's own buffer discounts with its own gamma
        undone = batch["discount"] > 0
        assert batch["discount"][0][undone[0]].unique().tolist() == [0.5]
        torch.testing.assert_close(batch["discount"][1][undone[1]].unique(), torch.tensor([0.99]))


def test_compiled_vmapped_dqn_update_equals_eager_and_does_not_recompile():
    rows, eager, state, buffers, (_, rollout) = vmapped_run(dqn, DQN, seed=0, num_seeds=2, collects=2, explore=True)
    compiled = seeds.make_agent(dqn, rows, envs.env_spec(DQN.env_id, 2 * DQN.num_envs), DQN.num_envs, compile=True)
    batch = multi.sample(buffers, DQN.batch_size)
    expect, expect_m = eager.update(state, batch)
    got, got_m = compiled.update(state, batch)
    assert_equal_td(got, expect, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_m["loss/q"], expect_m["loss/q"], rtol=1e-4, atol=1e-5)
    obs = rollout["obs"][0]
    torch.testing.assert_close(compiled.act(state, obs, None, False)[0], eager.act(state, obs, None, False)[0])
    compiled.act(state, obs, None, True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        got["env_steps"] += 100
        got, _ = compiled.update(got, multi.sample(buffers, DQN.batch_size))
        compiled.act(got, rollout["obs"][1], None, True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("name", ["rainbow", "sac"])
def test_train_num_seeds_logs_a_row_per_seed_and_resumes(name, tmp_path):
    config = dataclasses.replace(RAINBOW if name == "rainbow" else SAC, total_steps=96, learning_starts=24,
                                 replay_ratio=0.25)
    run = tmp_path / "run"
    result = train(name, config, seed=2, num_seeds=2, sweep={"gamma": [0.9, 0.99]}, log_dir=run, compile=False,
                   quiet=True, tensorboard=False, log_interval=48)
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert [(r["env_steps"], r["seed"], r["gamma"]) for r in rows] == [
        (s, seed, g) for s in ("48", "96") for g in ("0.9", "0.99") for seed in ("2", "3")]
    loss = "loss/q" if name == "rainbow" else "loss/critic"
    assert all(math.isfinite(float(r[loss])) for r in rows)
    # 24 env steps per collect, updates from env step 24: 6 per collect for 4 collects
    assert result.state["updates"].tolist() == [24] * 4 and int(rows[-1]["updates"]) == 24
    ckpt = load_checkpoint(run)
    assert ckpt["state"].batch_size == (4,) and ckpt["num_seeds"] == 2
    ckpt["config"]["total_steps"] = 120
    save_checkpoint(run / "checkpoint.pt", ckpt)
    resumed = train(name, None, resume=run, compile=False, quiet=True, tensorboard=False, log_interval=48)
    assert resumed.state["env_steps"].tolist() == [120] * 4   # (the replay restarts empty, as in single runs)
    assert len(set(resumed.state["updates"].tolist())) == 1 and len(resumed.history) == 12
    assert main(["eval", str(run), "--episodes", "1", "--row", "3"]) == 0   # one row, greedy


def test_bad_combinations_are_one_line_errors(tmp_path, capsys):
    tiny = ["--total-steps", "48", "--no-compile", "--quiet", "--log-dir", str(tmp_path / "x")]
    for argv, words in [
        (["train", "dqn", "--num-seeds", "2", "--sampler", "async"], "serial sampler"),
        (["train", "dqn", "--sweep", "tau=0.1,0.5"], "not a sweepable field of dqn"),
        (["train", "sac", "--sweep", "lr=1e-3,1e-4"], "actor_lr"),
        (["train", "r2d1", "--num-seeds", "2", "--sweep", "lr=1e-3,1e-4"], "r2d1 has no sweepable fields"),
        (["train", "impala", "--num-seeds", "2"], "not supported for impala"),
    ]:
        assert main(argv + tiny) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and len(err.splitlines()) == 1, err
    with pytest.raises(ConfigError, match="not supported"):
        seeds.make_rows(impala, impala.Config(), 0, 2)
