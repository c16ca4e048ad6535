"""Vmapped seeds and sweeps (fnrl.seeds): row k of a vmapped run is the single run with seed s + k."""
import csv
import dataclasses

import pytest
import torch

from fnrl import envs, rng, seeds
from fnrl.accel import staged
from fnrl.algos import a2c, ppo, r2d1
from fnrl.cli import main
from fnrl.errors import ConfigError
from fnrl.samplers import SerialSampler
from fnrl.train import load_checkpoint, save_checkpoint, train

# 4 minibatches per epoch, so the minibatch permutations matter
SMALL = ppo.Config(num_envs=4, num_steps=16, update_epochs=2, num_minibatches=4, total_steps=10_000)
SMALL_A2C = a2c.Config(num_envs=4, num_steps=8, total_steps=10_000)


def assert_close_td(a, b, **kw):
    for key, x in a.items(include_nested=True, leaves_only=True):
        torch.testing.assert_close(x, b[key], **kw)


def single_run(module, config, seed, explore, collects=1):
    """What `train(..., seed=seed)` builds: the env, the agent, its initial state, rollouts."""
    env = envs.make(config.env_id, config.num_envs, seed=rng.env_seeds(seed, config.num_envs))
    agent = module.make(config, env.spec)
    state = agent.init(seed)
    sampler = SerialSampler(env, agent.act, config.num_steps)
    return agent, state, [sampler.collect(state, explore=explore).clone() for _ in range(collects)]


def vmapped_run(module, config, seed, num_seeds, explore, sweep=None, compile=False):
    rows = seeds.make_rows(module, config, seed, num_seeds, sweep)
    env = seeds.make_env(config.env_id, rows, config.num_envs)
    agent = seeds.make_agent(module, rows, env.spec, config.num_envs, compile=compile)
    state = agent.init(seed)
    rollout = SerialSampler(env, agent.act, config.num_steps).collect(state, explore=explore).clone()
    return rows, agent, state, rollout


def row_of(rollout, r, num_envs):
    return rollout[:, r * num_envs:(r + 1) * num_envs]


def test_make_rows_orders_values_then_seeds_and_validates():
    rows = seeds.make_rows(ppo, SMALL, seed=5, num_seeds=2, sweep={"lr": [1e-3, 3e-4]})
    assert [(r.seed, r.config.learning_rate) for r in rows] == [(5, 1e-3), (6, 1e-3), (5, 3e-4), (6, 3e-4)]
    assert rows[2].labels == {"seed": 5, "learning_rate": 3e-4}
    assert seeds.env_seeds(rows[:2], 3) == rng.env_seeds(5, 3) + rng.env_seeds(6, 3)
    assert seeds.parse_sweep("learning-rate=1e-4,3e-4") == {"learning_rate": [1e-4, 3e-4]}
    for bad, kwargs, match in [
        (ppo, dict(num_seeds=0), "positive"),
        (ppo, dict(sweep={"num_envs": [4, 8]}), "not a sweepable field"),
        (ppo, dict(sweep={"learning_rate": [-1.0]}), "positive"),
        (ppo, dict(num_seeds=2, config=dataclasses.replace(SMALL, core="lstm")), "feed-forward"),
        (r2d1, dict(num_seeds=2, config=r2d1.Config(), sweep={"gamma": [0.9, 0.99]}), "no sweepable fields"),
    ]:
        with pytest.raises(ConfigError, match=match):
            seeds.make_rows(bad, kwargs.pop("config", SMALL), 0, **{"num_seeds": 1, **kwargs})
    with pytest.raises(ConfigError, match="FIELD=V1"):
        seeds.parse_sweep("learning_rate")


@pytest.mark.parametrize("module,config", [(ppo, SMALL), (a2c, SMALL_A2C)])
def test_greedy_collect_of_row_k_equals_single_run_with_seed_k(module, config):
    """End to end without sampling noise: same initial state, same env seeds, same acting."""
    rows, agent, state, rollout = vmapped_run(module, config, seed=3, num_seeds=3, explore=False)
    for k in range(3):
        _, single_state, (single,) = single_run(module, config, 3 + k, explore=False)
        assert_close_td(state[k], single_state, rtol=0, atol=0)
        mine = row_of(rollout, k, config.num_envs)
        for key in ("obs", "next_obs", "action", "reward", "done", "valid"):
            torch.testing.assert_close(mine[key], single[key], rtol=0, atol=0)
        for key in single.keys():
            torch.testing.assert_close(mine[key], single[key], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("module,config", [(ppo, SMALL), (a2c, SMALL_A2C),
                                           (a2c, dataclasses.replace(SMALL_A2C, normalize_reward=True))])
def test_first_update_of_row_k_equals_single_run_with_seed_k(module, config):
    """The vmapped update of row k = the single run's update on the same (explored) rollout,
    including PPO's minibatch permutations (drawn from the row's own seed)."""
    rows, agent, state, rollout = vmapped_run(module, config, seed=0, num_seeds=3, explore=True)
    torch.manual_seed(123)  # the global RNG must not matter
    new_state, metrics = agent.update(state, rollout)
    assert metrics.batch_size == (3,)
    for k in range(3):
        single = module.make(config, envs.env_spec(config.env_id, config.num_envs))
        single_state = single.init(k)
        torch.manual_seed(k)
        expect, expect_m = single.update(single_state, row_of(rollout, k, config.num_envs))
        assert_close_td(new_state[k], expect, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(metrics["loss"][k], expect_m["loss"], rtol=1e-5, atol=1e-6)


def test_learning_rate_sweep_rows_equal_single_runs_with_that_rate():
    values = [1e-3, 1e-4]
    rows, agent, state, rollout = vmapped_run(ppo, SMALL, seed=0, num_seeds=1, explore=True,
                                              sweep={"learning_rate": values})
    new_state, _ = agent.update(state, rollout)
    spec = envs.env_spec(SMALL.env_id, SMALL.num_envs)
    changes = []
    for r, lr in enumerate(values):
        single = ppo.make(dataclasses.replace(SMALL, learning_rate=lr), spec)
        expect, _ = single.update(single.init(0), row_of(rollout, r, SMALL.num_envs))
        assert_close_td(new_state[r], expect, rtol=1e-5, atol=1e-6)
        changes.append((expect["params", "actor", "0", "weight"] - state[r]["params", "actor", "0", "weight"]).abs().max())
    assert changes[0] > 3 * changes[1]  # the rows really trained with different rates


# a fixed clipping range (CleanRL's): the clip range is hp["clip_coef"] itself, which the vmapped
# update's scan once refused as an operand aliasing another
FIXED_CLIP = dataclasses.replace(SMALL, anneal_clip=False)


@pytest.fixture(scope="module")
def compiled_rows():
    rows = seeds.make_rows(ppo, FIXED_CLIP, 0, 2)
    spec = envs.env_spec(SMALL.env_id, 2 * SMALL.num_envs)
    return seeds.make_agent(ppo, rows, spec, SMALL.num_envs, compile=True)


def test_compiled_vmapped_update_as_a_loop_equals_eager(monkeypatch):
    """The vmapped minibatch steps as a loop of one compiled step (what a GPU runs, `fnrl.accel.staged.scan_on`)."""
    monkeypatch.setattr(staged, "scan_on", lambda device: False)
    rows, eager, state, rollout = vmapped_run(ppo, FIXED_CLIP, seed=0, num_seeds=2, explore=True)
    looped = seeds.make_agent(ppo, rows, envs.env_spec(SMALL.env_id, 2 * SMALL.num_envs), SMALL.num_envs,
                              compile=True)
    expect, expect_m = eager.update(state, rollout)
    got, got_m = looped.update(state, rollout)
    assert_close_td(got, expect, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_m["loss"], expect_m["loss"], rtol=1e-4, atol=1e-5)


def test_compiled_vmapped_update_equals_eager_and_does_not_recompile(compiled_rows):
    rows, eager, state, rollout = vmapped_run(ppo, FIXED_CLIP, seed=0, num_seeds=2, explore=True)
    expect, expect_m = eager.update(state, rollout)
    got, got_m = compiled_rows.update(state, rollout)
    assert_close_td(got, expect, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_m["loss"], expect_m["loss"], rtol=1e-4, atol=1e-5)
    obs = rollout["obs"][0]
    a_eager, x_eager, _ = eager.act(state, obs, None, False)
    a_comp, x_comp, _ = compiled_rows.act(state, obs, None, False)
    torch.testing.assert_close(a_comp, a_eager)
    torch.testing.assert_close(x_comp["logp"], x_eager["logp"], rtol=1e-5, atol=1e-5)
    compiled_rows.act(state, obs, None, True)
    got["env_steps"] += 64
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        got, _ = compiled_rows.update(got, rollout)
        compiled_rows.act(got, rollout["obs"][1], None, True)
        compiled_rows.act(got, rollout["obs"][2], None, False)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_vmapped_update_runs_ahead_of_time_after_another_schedule_length_was_traced():
    """The vmapped PPO update is one AOTInductor model (no fallback to torch.compile), also where
    the process traced one before with another learning-rate schedule length: TorchDynamo,
    which traces the scan's body inside the trace, must keep that Python int a constant (a
    symbol for it stops the vmapped division)."""
    import warnings

    for total in (10_000, 20_000):
        config = dataclasses.replace(FIXED_CLIP, total_steps=total)
        rows, eager, state, rollout = vmapped_run(ppo, config, seed=0, num_seeds=2, explore=True)
        compiled = seeds.make_agent(ppo, rows, envs.env_spec(SMALL.env_id, 2 * SMALL.num_envs), SMALL.num_envs,
                                    compile=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="the PPO update is not ahead-of-time")
            got, _ = compiled.update(state, rollout)
        assert_close_td(got, eager.update(state, rollout)[0], rtol=1e-4, atol=1e-5)


def test_train_num_seeds_writes_rows_per_seed_and_resumes(tmp_path):
    run = tmp_path / "run"
    config = dataclasses.replace(SMALL, total_steps=128)
    result = train("ppo", config, seed=2, num_seeds=2, sweep={"gae_lambda": [0.8, 0.95]}, log_dir=run,
                   compile=False, quiet=True, tensorboard=False, log_interval=64)
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert [(r["env_steps"], r["seed"], r["gae_lambda"]) for r in rows[:4]] == [
        ("64", "2", "0.8"), ("64", "3", "0.8"), ("64", "2", "0.95"), ("64", "3", "0.95")]
    assert len(rows) == 8 and "loss/policy" in rows[0] and (run / "curve.png").exists()
    ckpt = load_checkpoint(run)
    assert ckpt["state"].batch_size == (4,) and ckpt["num_seeds"] == 2
    assert ckpt["state"]["hp", "gae_lambda"].tolist() == pytest.approx([0.8, 0.8, 0.95, 0.95])
    assert result.state["env_steps"].tolist() == [128] * 4
    ckpt["config"]["total_steps"] = 192  # extend the run, then resume it
    save_checkpoint(run / "checkpoint.pt", ckpt)
    resumed = train("ppo", None, resume=run, compile=False, quiet=True, tensorboard=False, log_interval=64)
    assert [r["env_steps"] for r in resumed.history[-4:]] == [192] * 4
    assert resumed.state["env_steps"].tolist() == [192] * 4


def test_cli_options(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["--num-envs", "4", "--num-steps", "16", "--total-steps", "64", "--no-compile",
            "--quiet", "--log-dir", str(run)]
    assert main(["train", "a2c", "--num-seeds", "2", "--sweep", "lr=1e-3,3e-4", *tiny]) == 0
    rows = list(csv.DictReader(open(run / "progress.csv")))
    assert {(r["seed"], r["learning_rate"]) for r in rows} == {("0", "0.001"), ("1", "0.001"), ("0", "0.0003"),
                                                               ("1", "0.0003")}
    capsys.readouterr()
    assert main(["train", "ppo", "--sweep", "num_envs=4,8", *tiny[:-2], "--log-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a sweepable field" in err and len(err.splitlines()) == 1
    assert main(["eval", str(run), "--episodes", "1"]) == 2     # a vmapped run: which row?
    err = capsys.readouterr().err.strip()
    assert "holds 4 vmapped rows" in err and "--row K" in err and len(err.splitlines()) == 1
    assert main(["eval", str(run), "--episodes", "1", "--row", "3"]) == 0
    assert "1 episodes" in capsys.readouterr().out
