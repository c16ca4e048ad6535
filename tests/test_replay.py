"""Tests for fnrl.replay: n-step targets, sampleable rows, sum tree, priorities, frames, memmap."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from fnrl import replay
from fnrl.replay.sum_tree import (ARITY, sum_tree_find, sum_tree_get, sum_tree_init, sum_tree_levels,
                                  sum_tree_sample, sum_tree_set, sum_tree_total)
from tests.stats import chisquare_pvalue


# ----------------------------------------------------------------------------- helpers

def make_rollout(obs, reward, terminated, truncated, valid, **extras) -> TensorDict:
    """A [T, B] rollout in the sampler's layout from per-step arrays; obs is [T + 1, B, ...]."""
    T, B = reward.shape
    fields = {"obs": obs[:-1], "next_obs": obs[1:], "action": torch.zeros(T, B, dtype=torch.int64),
              "reward": reward, "terminated": terminated, "truncated": truncated,
              "done": terminated | truncated, "valid": valid, **extras}
    return TensorDict(fields, batch_size=[T, B])


class RandomEpisodes:
    """EnvPool-style [T, B] rollouts: random ends, a reset step (valid=False, reward 0) after
    every done, obs row a of env b = [a, b, noise], plus an extra `time` = a. Keeps the
    whole history so tests can compute references for any absolute row."""

    def __init__(self, num_envs, p_terminate=0.1, p_truncate=0.1, seed=0):
        self.B, self.p_term, self.p_trunc = num_envs, p_terminate, p_truncate
        self.rng = np.random.default_rng(seed)
        self.prev_done = np.zeros(num_envs, dtype=bool)
        self.obs = [self._obs(0)]
        self.reward, self.terminated, self.truncated, self.valid = [], [], [], []

    def _obs(self, a):
        return np.stack([np.full(self.B, a), np.arange(self.B), self.rng.normal(size=self.B)], 1)

    def rollout(self, T):
        start = len(self.reward)
        for a in range(start, start + T):
            valid = ~self.prev_done
            u = self.rng.random(self.B)
            term = valid & (u < self.p_term)
            trunc = valid & (u >= self.p_term) & (u < self.p_term + self.p_trunc)
            self.reward.append(np.where(valid, self.rng.normal(size=self.B), 0.0))
            self.terminated.append(term), self.truncated.append(trunc), self.valid.append(valid)
            self.obs.append(self._obs(a + 1))
            self.prev_done = term | trunc
        sl = slice(start, start + T)
        as_t = lambda x, dtype: torch.tensor(np.array(x[sl]), dtype=dtype)
        obs = torch.tensor(np.array(self.obs[start:start + T + 1]), dtype=torch.float32)
        time = torch.arange(start, start + T).unsqueeze(1).expand(T, self.B).clone()
        return make_rollout(obs, as_t(self.reward, torch.float32), as_t(self.terminated, torch.bool),
                            as_t(self.truncated, torch.bool), as_t(self.valid, torch.bool), time=time)

    def target(self, a, b, n, gamma):
        """Loop reference: (n-step return, bootstrap discount, m) of absolute row a, env b."""
        ret, disc = 0.0, 1.0
        for k in range(n):
            ret += disc * self.reward[a + k][b]
            disc *= gamma * (1.0 - self.terminated[a + k][b])
            if self.terminated[a + k][b] or self.truncated[a + k][b]:
                return ret, disc, k + 1
        return ret, disc, n

    def sampleable(self, steps, capacity_per_env, n):
        """Reference rule: valid and W - C <= a <= W - 1 - n."""
        lo = max(0, steps - capacity_per_env)
        return {(a, b) for a in range(lo, steps - n) for b in range(self.B) if self.valid[a][b]}


def draw(buffer, total, batch_size, beta=0.4, seed=0):
    """About `total` samples in batches of at most `batch_size` (and at most the sampleable rows)."""
    g = torch.Generator().manual_seed(seed)
    batch_size = min(batch_size, replay.num_sampleable(buffer))
    calls = -(-total // batch_size)
    return torch.cat([replay.sample(buffer, batch_size, beta, generator=g) for _ in range(calls)])


# ----------------------------------------------------------------------------- n-step, hand-built

def hand_built_rollout():
    """One env, gamma = 0.5, n = 3. Rows: 0..2 an episode that terminates at 2; 3 the reset
    step (valid=False, obs = final obs 103); 4..5 an episode truncated at 5; 6 the reset
    step (obs 106 = final obs of the truncated episode); 7..11 a running episode.
    Env 1 has the same flags and ten times the rewards."""
    reward = torch.tensor([1., 2., 3., 0., 4., 5., 0., 6., 7., 8., 9., 10.])
    flags = lambda *rows: torch.tensor([t in rows for t in range(12)])
    obs = 100. + torch.arange(13.)
    return make_rollout(torch.stack([obs, obs + 1000], 1).unsqueeze(-1), torch.stack([reward, 10 * reward], 1),
                        torch.stack([flags(2)] * 2, 1), torch.stack([flags(5)] * 2, 1),
                        ~torch.stack([flags(3, 6)] * 2, 1))


# row: (n-step return, bootstrap discount, next_obs) worked by hand for gamma = 0.5, n = 3
HAND_TARGETS = {
    0: (1 + 0.5 * 2 + 0.25 * 3, 0.0, 103.),   # terminated at row 2 inside the window
    1: (2 + 0.5 * 3, 0.0, 103.),
    2: (3.0, 0.0, 103.),
    4: (4 + 0.5 * 5, 0.25, 106.),             # truncated at row 5: bootstrap from final obs
    5: (5.0, 0.5, 106.),
    7: (6 + 0.5 * 7 + 0.25 * 8, 0.125, 110.),
    8: (7 + 0.5 * 8 + 0.25 * 9, 0.125, 111.),
}                                             # rows 3, 6 invalid; 9..11 = newest n rows


@pytest.mark.parametrize("prioritized", [False, True])
def test_n_step_targets_hand_built(prioritized):
    buffer = replay.init(hand_built_rollout(), 48, n_step=3, gamma=0.5, prioritized=prioritized)
    buffer = replay.add(buffer, hand_built_rollout())
    assert replay.size(buffer) == 24 and replay.num_sampleable(buffer) == 2 * len(HAND_TARGETS)
    batch = draw(buffer, 4200, 1000)
    rows, envs = batch["index"] // 2, batch["index"] % 2
    assert set(rows.tolist()) == set(HAND_TARGETS)
    for row, (ret, disc, next_obs) in HAND_TARGETS.items():
        for env, scale, offset in ((0, 1.0, 0.0), (1, 10.0, 1000.0)):
            sel = (rows == row) & (envs == env)
            assert sel.any()
            torch.testing.assert_close(batch["reward"][sel], torch.full((int(sel.sum()),), scale * ret))
            torch.testing.assert_close(batch["discount"][sel], torch.full((int(sel.sum()),), disc))
            assert (batch["obs"][sel, 0] == 100. + row + offset).all()
            assert (batch["next_obs"][sel, 0] == next_obs + offset).all()
    assert batch["valid"].all() and (batch["weight"] == 1).all()
    assert (batch["terminated"] == (rows == 2)).all() and (batch["truncated"] == (rows == 5)).all()


def test_newest_rows_become_sampleable_after_next_add():
    buffer = replay.init(hand_built_rollout(), 48, n_step=3, gamma=0.5)
    buffer = replay.add(buffer, hand_built_rollout())
    buffer = replay.add(buffer, hand_built_rollout())     # rows 12..23: same pattern again
    # rows 9, 10, 11 now have their windows; row 12+3 = 15 is invalid, 20..23 are the newest n
    expected = set(HAND_TARGETS) | {9, 10, 11} | {12 + r for r in HAND_TARGETS if 12 + r <= 20}
    assert replay.num_sampleable(buffer) == 2 * len(expected)
    batch = draw(buffer, 3400, 1000)
    assert set((batch["index"] // 2).tolist()) == expected
    sel = batch["index"] == 2 * 9                           # row 9: 8 + .5 * 9 + .25 * 10, bootstrap row 12
    torch.testing.assert_close(batch["reward"][sel], torch.full((int(sel.sum()),), 8 + 4.5 + 2.5))
    assert (batch["next_obs"][sel, 0] == 100.).all()       # row 12 = first row of the second rollout
    sel = batch["index"] == 2 * 11                          # row 11: window 11, 12, 13 crosses the rollouts
    torch.testing.assert_close(batch["reward"][sel], torch.full((int(sel.sum()),), 10 + 0.5 * 1 + 0.25 * 2))
    assert (batch["next_obs"][sel, 0] == 102.).all() and (batch["discount"][sel] == 0.125).all()


def test_a_clone_and_its_buffer_change_apart():
    buffer = replay.add(replay.init(hand_built_rollout(), 48, n_step=3, gamma=0.5, prioritized=True),
                        hand_built_rollout())
    copy = replay.clone(buffer)
    replay.update_priorities(copy, torch.tensor([0, 2]), torch.tensor([5.0, 7.0]))
    copy = replay.add(copy, hand_built_rollout())
    assert replay.num_sampleable(buffer) == 2 * len(HAND_TARGETS) and replay.size(buffer) == 24
    assert replay.num_sampleable(copy) > replay.num_sampleable(buffer) and replay.size(copy) == 48
    assert (buffer.rows["priority"][:12] == 1).all() and buffer.max_priority == 1
    assert copy.max_priority > 1 and (copy.rows["priority"][:12] != 1).any()


# ----------------------------------------------------------------------------- loop reference, wrap-around

def sampleable_leaves(buffer):
    """(row, env) pairs whose sum-tree leaf is positive, as absolute rows (via the `time` extra)."""
    leaf = (sum_tree_get(buffer.tree, torch.arange(buffer.spec.capacity)) > 0).nonzero().squeeze(1)
    B = buffer.spec.num_envs
    return set(zip(buffer.storage["time"][leaf // B, leaf % B].tolist(), (leaf % B).tolist()))


@pytest.mark.parametrize("prioritized", [False, True])
def test_samples_match_loop_reference_with_wraparound(prioritized):
    n, gamma, C, T, B, adds = 3, 0.9, 40, 16, 3, 13          # 208 rows per env: the ring wraps five times
    episodes = RandomEpisodes(B, seed=1)
    rollouts = [episodes.rollout(T) for _ in range(adds)]
    reference = torch.tensor([[episodes.target(a, b, n, gamma) for b in range(B)] for a in range(adds * T - n)],
                             dtype=torch.float64)                      # [rows, B, (return, discount, m)]
    buffer = replay.init(rollouts[0], C * B, n_step=n, gamma=gamma, prioritized=prioritized)
    g = torch.Generator().manual_seed(0)
    for step, rollout in enumerate(rollouts, 1):
        buffer = replay.add(buffer, rollout)
        allowed = episodes.sampleable(step * T, C, n)
        assert replay.num_sampleable(buffer) == len(allowed) == len(sampleable_leaves(buffer))
        assert sampleable_leaves(buffer) == allowed
        assert_tree_consistent(buffer.tree)
        batch = draw(buffer, 1200, 120, seed=step)
        time, env = batch["time"], batch["index"] % B
        assert set(zip(time.tolist(), env.tolist())) <= allowed     # never invalid, incomplete, overwritten
        ret, disc, m = reference[time, env].unbind(-1)
        assert torch.equal(batch["obs"][:, :2], torch.stack([time, env], 1).float())
        assert torch.equal(batch["next_obs"][:, :2], torch.stack([time + m.long(), env], 1).float())
        torch.testing.assert_close(batch["reward"].double(), ret, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch["discount"].double(), disc, rtol=1e-6, atol=0.0)
        if prioritized:
            buffer = replay.update_priorities(buffer, batch["index"][:50], torch.randn(50, generator=g))


def test_uniform_sampling_is_uniform_over_sampleable_rows():
    C, T, B = 64, 32, 4
    episodes = RandomEpisodes(B, seed=2)
    buffer = replay.init(episodes.rollout(T), C * B, n_step=2)
    episodes = RandomEpisodes(B, seed=2)
    for _ in range(3):
        buffer = replay.add(buffer, episodes.rollout(T))
    allowed = sorted(episodes.sampleable(3 * T, C, 2))
    batch = draw(buffer, 100_000, 250)
    counts = {key: 0 for key in allowed}
    for key in zip(batch["time"].tolist(), (batch["index"] % B).tolist()):
        counts[key] += 1                              # KeyError = a row that must not be sampled
    assert len(counts) == len(allowed)
    assert chisquare_pvalue(list(counts.values())) > 1e-3


# ----------------------------------------------------------------------------- sum tree

def random_tree(num_leaves, seed):
    g = torch.Generator().manual_seed(seed)
    value = torch.rand(num_leaves, generator=g, dtype=torch.float64) * (torch.rand(num_leaves, generator=g) > 0.3)
    return sum_tree_set(sum_tree_init(num_leaves), torch.arange(num_leaves), value), value


def assert_tree_consistent(tree):
    """Every inner node equals the sum of its children; the root equals the sum of the leaves."""
    levels = sum_tree_levels(tree)
    for parent, children in zip(levels[:-1], levels[1:]):
        torch.testing.assert_close(parent, children.view(-1, ARITY).sum(-1), rtol=1e-14, atol=0.0)
    torch.testing.assert_close(sum_tree_total(tree), levels[-1].sum(), rtol=1e-12, atol=0.0)


def test_sum_tree_hand_example():
    assert ARITY == 32
    tree = sum_tree_set(sum_tree_init(40), torch.tensor([0, 1, 35]), torch.tensor([3.0, 1.0, 2.0]))
    levels = sum_tree_levels(tree)                        # 40 leaves: root, 32 inner nodes, 1024 leaves
    assert [len(level) for level in levels] == [1, 32, 1024]
    assert levels[0].tolist() == [6.0] and levels[1][:3].tolist() == [4.0, 2.0, 0.0] and levels[1].sum() == 6
    found = sum_tree_find(tree, torch.tensor([0.0, 2.99, 3.0, 3.99, 4.0, 5.99, 6.0, 7.0], dtype=torch.float64))
    assert found.tolist() == [0, 0, 1, 1, 35, 35, 35, 35]                   # mass >= total: last positive leaf
    tree = sum_tree_set(tree, torch.tensor([1, 1, 1000]), torch.tensor([2.0, 2.0, 5.0]))
    assert levels[0].tolist() == [12.0] and levels[1][[0, 1, 31]].tolist() == [5.0, 2.0, 5.0]
    assert sum_tree_find(tree, torch.tensor([11.99], dtype=torch.float64)).tolist() == [1000]


@pytest.mark.parametrize("stratified", [False, True])
def test_sum_tree_sampling_matches_priorities(stratified):
    tree, value = random_tree(100, seed=3)
    g = torch.Generator().manual_seed(4)
    leaf = torch.cat([sum_tree_sample(tree, 1000, stratified=stratified, generator=g) for _ in range(100)])
    counts = torch.bincount(leaf, minlength=100)
    assert (counts[value == 0] == 0).all()
    positive = value > 0
    expected = (value[positive] / value.sum() * len(leaf)).numpy()
    assert chisquare_pvalue(counts[positive].numpy(), expected) > 1e-3


def test_sum_tree_batch_updates_keep_parents_consistent():
    """5000 leaves: three levels below the root."""
    tree, value = random_tree(5000, seed=5)
    g = torch.Generator().manual_seed(6)
    for _ in range(20):
        index = torch.randint(0, 5000, (64,), generator=g)
        new = torch.rand(64, generator=g, dtype=torch.float64)
        new = new[torch.unique(index, return_inverse=True)[1]]   # duplicates carry one value
        tree = sum_tree_set(tree, index, new)
        value[index] = new
        assert_tree_consistent(tree)
        assert torch.equal(sum_tree_get(tree, torch.arange(5000)), value)


# ----------------------------------------------------------------------------- priorities, weights

def test_importance_weights_and_new_row_priority_hand_checked():
    reward = torch.zeros(5, 1)
    flag = torch.zeros(5, 1, dtype=torch.bool)
    rollout = make_rollout(torch.zeros(6, 1, 1), reward, flag, flag, ~flag)
    buffer = replay.init(rollout, 10, prioritized=True, alpha=0.5, priority_eps=0.0)
    buffer = replay.add(buffer, rollout)                  # rows 0..3 sampleable, row 4 newest
    # p = |delta|^0.5 = [2, 1, 1, 0]: P = [.5, .25, .25, 0]; 4 strata of mass 1 pin the draws to rows 0, 0, 1, 2
    buffer = replay.update_priorities(buffer, torch.tensor([0, 1, 2, 3]), torch.tensor([4.0, -1.0, 1.0, 0.0]))
    batch = replay.sample(buffer, 4, beta=0.5)
    assert batch["index"].tolist() == [0, 0, 1, 2]
    # w = (4 P)^-0.5 / max = [2^-.5, 2^-.5, 1, 1] / 1
    torch.testing.assert_close(batch["weight"], torch.tensor([0.5 ** 0.5, 0.5 ** 0.5, 1.0, 1.0]))
    torch.testing.assert_close(replay.sample(buffer, 4, beta=1.0)["weight"], torch.tensor([0.5, 0.5, 1.0, 1.0]))
    torch.testing.assert_close(replay.sample(buffer, 4, beta=0.0)["weight"], torch.ones(4))
    buffer = replay.add(buffer, rollout)                  # rows 5..9 arrive at the max priority so far, 2
    assert buffer.rows["priority"][:, 0].tolist() == [2.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    leaves = sum_tree_get(buffer.tree, torch.arange(10)).tolist()
    assert leaves == [2.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0]   # row 9 (newest) not yet sampleable
    assert_tree_consistent(buffer.tree)


# ----------------------------------------------------------------------------- frames vs EnvPool

def envpool_rollouts(task, T, steps, **kwargs):
    """Random-action [T, B] rollouts of a real EnvPool Atari env in the sampler's layout."""
    envpool = pytest.importorskip("envpool")
    env = envpool.make(task, env_type="gymnasium", num_envs=2, episodic_life=True, reward_clip=True, seed=0,
                       **kwargs)
    obs, _ = env.reset()
    rng = np.random.default_rng(0)
    prev_done = np.zeros(2, dtype=bool)
    stacks, rewards, terms, truncs, valids = [obs], [], [], [], []
    for _ in range(steps):
        obs, reward, term, trunc, _ = env.step(rng.integers(0, env.action_space.n, size=2))
        stacks.append(obs), rewards.append(reward), terms.append(term), truncs.append(trunc)
        valids.append(~prev_done)
        prev_done = term | trunc
    stacks = torch.from_numpy(np.stack(stacks))
    t = lambda x, dtype: torch.from_numpy(np.stack(x)).to(dtype)
    full = make_rollout(stacks, t(rewards, torch.float32), t(terms, torch.bool), t(truncs, torch.bool),
                        t(valids, torch.bool), time=torch.arange(steps).unsqueeze(1).expand(steps, 2).clone())
    return [full[i:i + T] for i in range(0, steps, T)], stacks, full


@pytest.mark.parametrize("task, steps, kwargs", [("Pong-v5", 256, {"max_episode_steps": 40}),  # truncations
                                                 ("Breakout-v5", 160, {})])        # life losses: stack slides on
def test_frame_dedup_rebuilds_envpool_stacks(task, steps, kwargs):
    n, C, T = 3, 64, 32
    rollouts, stacks, full = envpool_rollouts(task, T, steps, **kwargs)
    buffer = replay.init(rollouts[0], 2 * C, n_step=n, gamma=0.99, frame_dedup=True)
    assert buffer.storage["obs"].shape == (C, 2, 84, 84)
    after_reset = ~full["valid"].roll(1, 0)
    after_reset[0] = True                                 # rows that open an episode: stacks [f0, f0, f0, f0]
    near_start = after_reset | after_reset.roll(1, 0) | after_reset.roll(2, 0)   # stacks that hold copies
    all_equal = (stacks[:-1, :, :-1] == stacks[:-1, :, -1:]).flatten(2).all(-1)
    slides_on = after_reset & ~all_equal                  # life-loss resets: the stack keeps the old frames
    checked_near_start = checked_slides_on = 0
    for i, rollout in enumerate(rollouts):
        buffer = replay.add(buffer, rollout)
        if not replay.can_sample(buffer, 64):
            continue
        batch = draw(buffer, 1024, 128, seed=i)
        time, env = batch["time"], batch["index"] % 2
        assert batch["valid"].all()
        assert torch.equal(batch["obs"], stacks[time, env])
        m = torch.ones_like(time)                         # n-step window length: up to the first done
        for k in range(n - 1):
            m += (m == k + 1) & ~full["done"][time + k, env]
        assert torch.equal(batch["next_obs"], stacks[time + m, env])
        checked_near_start += int(near_start[time, env].sum())
        checked_slides_on += int(slides_on[time, env].sum())
    assert int((~full["valid"]).sum()) >= 4, "the run should contain several resets"
    assert checked_near_start > 0
    assert (checked_slides_on > 0) == (task == "Breakout-v5")


# ----------------------------------------------------------------------------- memmap, nested obs, errors

def test_memmap_storage_round_trips(tmp_path):
    n, C, T, B = 2, 24, 10, 2
    episodes = RandomEpisodes(B, seed=7)
    first = episodes.rollout(T)
    in_ram = replay.init(first, C * B, n_step=n, prioritized=True)
    mapped = replay.init(first, C * B, n_step=n, prioritized=True, memmap_dir=tmp_path)
    assert mapped.storage.is_memmap() and (tmp_path / "obs.memmap").exists()
    rollouts = [first] + [episodes.rollout(T) for _ in range(4)]        # 50 rows per env: wraps
    for rollout in rollouts:
        in_ram, mapped = replay.add(in_ram, rollout), replay.add(mapped, rollout)
    reloaded = TensorDict.load_memmap(tmp_path)
    assert (reloaded == in_ram.storage).all()
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    a, b = replay.sample(in_ram, 32, generator=g1), replay.sample(mapped, 32, generator=g2)
    assert set(a.keys()) == set(b.keys()) and all(torch.equal(a[k], b[k]) for k in a.keys())


def test_compiled_sample_equals_eager_without_recompiles():
    """`sample(..., compiled=True)` draws the same rows (same global RNG stream) and builds the
    same batch as eager, uniform and prioritized, across adds (ring wraparound) and betas,
    with one graph per buffer kind."""
    from torch._dynamo.utils import counters

    n, C, T, B = 3, 40, 16, 3
    episodes = RandomEpisodes(B, seed=2)
    rollouts = [episodes.rollout(T) for _ in range(5)]
    counters.clear()
    for prioritized in (False, True):
        buffer = replay.init(rollouts[0], C * B, n_step=n, gamma=0.9, prioritized=prioritized)
        for step, rollout in enumerate(rollouts):
            buffer = replay.add(buffer, rollout)
            beta = 0.4 + 0.1 * step
            torch.manual_seed(step)
            eager = replay.sample(buffer, 24, beta)
            torch.manual_seed(step)
            compiled = replay.sample(buffer, 24, beta, compiled=True)
            assert set(eager.keys()) == set(compiled.keys())
            for key in eager.keys():
                torch.testing.assert_close(compiled[key], eager[key], rtol=1e-6, atol=1e-6)
            if prioritized:
                buffer = replay.update_priorities(buffer, eager["index"], torch.randn(24))
    assert counters["stats"]["unique_graphs"] == 2          # one per buffer kind, no recompiles


def test_nested_obs():
    T, B = 6, 2
    obs = TensorDict({"pos": torch.arange(T + 1.).view(-1, 1, 1).expand(T + 1, B, 3),
                      "img": torch.arange(T + 1).view(-1, 1, 1, 1).expand(T + 1, B, 2, 2).to(torch.uint8)},
                     batch_size=[T + 1, B])
    flag = torch.zeros(T, B, dtype=torch.bool)
    rollout = make_rollout(obs, torch.ones(T, B), flag, flag, ~flag)
    buffer = replay.add(replay.init(rollout, 2 * T, n_step=2), rollout)
    batch = replay.sample(buffer, 8)
    row = batch["index"] // B
    assert torch.equal(batch["obs", "pos"][:, 0], row.float())
    assert torch.equal(batch["next_obs", "img"][:, 0, 0], (row + 2).to(torch.uint8))


def test_errors():
    episodes = RandomEpisodes(2)
    rollout = episodes.rollout(8)
    with pytest.raises(ValueError, match="fewer than one rollout"):
        replay.init(rollout, 10)
    with pytest.raises(ValueError, match="n_step=8 does not fit"):
        replay.init(rollout, 16, n_step=8)
    with pytest.raises(ValueError, match="frame_dedup needs obs"):
        replay.init(rollout, 16, frame_dedup=True)
    with pytest.raises(ValueError, match="lacks the keys"):
        replay.init(rollout.exclude("valid"), 16)
    buffer = replay.init(rollout, 32, n_step=2)
    with pytest.raises(ValueError, match="sampleable rows"):
        replay.sample(buffer, 4)
    assert not replay.can_sample(buffer, 1)
    buffer = replay.add(buffer, rollout)
    with pytest.raises(ValueError, match="exceeds the buffer capacity"):
        replay.sample(buffer, 33)
    with pytest.raises(ValueError, match="missing"):
        replay.add(buffer, rollout.exclude("time"))
    with pytest.raises(ValueError, match="unexpected"):
        replay.add(buffer, rollout.clone().set("extra", torch.zeros(8, 2)))
    with pytest.raises(ValueError, match="rollout\\['obs'\\]"):
        replay.add(buffer, rollout.clone().set("obs", torch.zeros(8, 2, 4)))
    with pytest.raises(ValueError, match="num_envs=2"):
        replay.add(buffer, rollout[:, :1])
    reused = rollout.clone()   # a sampler's rollout: checked once, re-checked when its keys change
    buffer = replay.add(replay.add(buffer, reused), reused)
    reused.set("extra", torch.zeros(8, 2))
    with pytest.raises(ValueError, match="unexpected"):
        replay.add(buffer, reused)
    with pytest.raises(ValueError, match="prioritized=True"):
        replay.update_priorities(buffer, torch.tensor([0]), torch.tensor([1.0]))


@pytest.mark.parametrize("ahead_of_time", [False, True], ids=["torch_compile", "ahead_of_time"])
def test_compiled_add_equals_eager_without_recompiles(ahead_of_time):
    """`add(..., compiled=True)` leaves the same storage, sampleable rows, count and sum tree as
    eager adds, across ring wraparounds, with priorities changed in between; it starts once
    W >= n (first add eager) and compiles once (ahead of time: an AOTInductor model, no
    TorchDynamo graph at all)."""
    from torch._dynamo.utils import counters

    n, C, T, B = 3, 20, 5, 3
    episodes = RandomEpisodes(B, seed=4)
    rollouts = [episodes.rollout(T) for _ in range(12)]   # 60 rows per env: three wraparounds
    buffers = [replay.init(rollouts[0], C * B, n_step=n, gamma=0.9, prioritized=True) for _ in range(2)]
    counters.clear()
    for step, rollout in enumerate(rollouts):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="replay writes are not ahead-of-time")   # no fallback
            buffers = [replay.add(buffer, rollout, compiled=c, ahead_of_time=ahead_of_time)
                       for buffer, c in zip(buffers, (False, True))]
        eager, compiled = buffers
        assert compiled.steps_written == eager.steps_written
        torch.testing.assert_close(compiled.storage.to_dict(), eager.storage.to_dict(), rtol=0, atol=0)
        torch.testing.assert_close(compiled.rows.to_dict(), eager.rows.to_dict(), rtol=0, atol=0)
        assert int(compiled.sampleable_count) == int(eager.sampleable_count) == int(eager.rows["sampleable"].sum())
        torch.testing.assert_close(compiled.tree, eager.tree, rtol=1e-12, atol=1e-12)
        if replay.can_sample(eager, 8):
            index = replay.sample(eager, 8, generator=torch.Generator().manual_seed(step))["index"]
            td = torch.randn(8, generator=torch.Generator().manual_seed(100 + step))
            buffers = [replay.update_priorities(b, index, td) for b in buffers]
    assert counters["stats"]["unique_graphs"] == (0 if ahead_of_time else 1)
