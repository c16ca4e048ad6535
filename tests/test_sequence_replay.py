"""Tests for fnrl.replay.sequence: sampleable sequences, stored carries, masks, priorities, frames."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from fnrl.replay import sequence
from fnrl.replay.sum_tree import sum_tree_get
from tests.stats import chisquare_pvalue
from tests.test_replay import RandomEpisodes, envpool_rollouts, make_rollout


def with_carry(rollout: TensorDict) -> TensorDict:
    """Add a per-step carry {"h": [time, env], "c": -time} as the sampler's extras["carry"] would."""
    time = rollout["time"].float()
    env = torch.arange(rollout.batch_size[1]).float().expand_as(time)
    carry = TensorDict({"h": torch.stack([time, env], -1), "c": -time.unsqueeze(-1)}, batch_size=rollout.batch_size)
    rollout = rollout.clone()
    rollout.set("carry", carry)
    return rollout


def reference_starts(steps, C, k, L, B):
    """Loop reference of the sampleable (start, env) pairs: a % k == 0, W - C <= a, a + L <= W."""
    return {(a, b) for a in range(max(0, steps - C), steps - L + 1) if a % k == 0 for b in range(B)}


def sampleable_leaves(buffer):
    """(start, env) of positive leaves, absolute start read from the stored `time` column."""
    spec = buffer.spec
    leaf = (sum_tree_get(buffer.tree, torch.arange(spec.slots * spec.num_envs)) > 0).nonzero().squeeze(1)
    slot, env = leaf // spec.num_envs, leaf % spec.num_envs
    return set(zip(buffer.storage["time"][slot * spec.carry_interval, env].tolist(), env.tolist()))


def draw(buffer, calls, batch_size, seed=0, beta=0.4):
    """`calls` samples of `batch_size` sequences, concatenated along the batch dim."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([sequence.sample(buffer, batch_size, beta, generator=g) for _ in range(calls)], 1)


def reference_mask(valid, done, burn_in, seq_len):
    """Loop reference of `mask` for one sequence [L]."""
    mask, ended = [False] * len(valid), False
    for t in range(burn_in, burn_in + seq_len):
        mask[t] = bool(valid[t]) and not ended
        ended = ended or bool(done[t])
    return mask


# ----------------------------------------------------------------------------- hand-built

def test_hand_built_sequences_mask_reset_and_carry():
    """One env, burn_in 2, seq_len 4, n 2 (L = 8), k = 4, C = 24. Episode 1 terminates at
    row 5, row 6 is the reset step (valid=False), episode 2 starts at row 7."""
    T = 16
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[5] = True
    valid = torch.ones(T, 1, dtype=torch.bool)
    valid[6] = False
    obs = torch.arange(T + 1.).view(T + 1, 1, 1)
    rollout = with_carry(make_rollout(obs, torch.arange(T * 1.).view(T, 1), done, torch.zeros_like(done), valid,
                                      time=torch.arange(T).view(T, 1)))
    buffer = sequence.init(rollout, 24, burn_in=2, seq_len=4, n_step=2, carry_interval=4)
    buffer = sequence.add(buffer, rollout)
    # starts 0, 4, 8 have all 8 rows written (8 + 8 <= 16); 12 does not
    assert sequence.num_sampleable(buffer) == 3 and sampleable_leaves(buffer) == {(0, 0), (4, 0), (8, 0)}
    batch = draw(buffer, 100, 3)
    assert batch.batch_size == (8, 300)
    start = batch["time"][0]
    assert set(start.tolist()) == {0, 4, 8}
    assert torch.equal(batch["time"], start + torch.arange(8).unsqueeze(1))
    assert torch.equal(batch["obs"][..., 0], batch["time"].float())
    # stored carry = the carry of the first row; per-sequence entries are views along time
    assert torch.equal(batch["carry", "h"][0, :, 0], start.float())
    assert torch.equal(batch["carry", "c"][3, :, 0], -start.float())
    assert sequence.sample(buffer, 3)["weight"].stride(0) == 0 and (batch["weight"] == 1).all()
    # reset computed as "not valid at the previous row" (first row ever: True): rows 0 and 7
    assert torch.equal(buffer.storage["reset"][:16, 0], torch.isin(torch.arange(16), torch.tensor([0, 7])))
    # masks worked by hand: trained rows are 2..5 of each sequence
    expected = {0: [0, 0, 1, 1, 1, 1, 0, 0],     # rows 2..5; the done row 5 itself is trained
                4: [0, 0, 0, 1, 1, 1, 0, 0],     # rows 6..9: 6 is the reset step; the done at 5 is in the burn-in
                8: [0, 0, 1, 1, 1, 1, 0, 0]}     # rows 10..13: one episode
    for a, m in expected.items():
        col = (start == a).nonzero()[0, 0]
        assert batch["mask"][:, col].tolist() == [bool(x) for x in m]


def test_done_inside_trained_part_masks_the_rest():
    T = 16
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[3] = True
    valid = torch.ones(T, 1, dtype=torch.bool)
    valid[4] = False
    rollout = make_rollout(torch.zeros(T + 1, 1, 1), torch.zeros(T, 1), done, torch.zeros_like(done), valid,
                           time=torch.arange(T).view(T, 1))
    buffer = sequence.init(rollout, 24, burn_in=2, seq_len=4, n_step=2, carry_interval=4)
    buffer = sequence.add(buffer, rollout)
    batch = draw(buffer, 30, 3, seed=1)
    col = (batch["time"][0] == 0).nonzero()[0, 0]
    assert batch["mask"][:, col].tolist() == [False, False, True, True, False, False, False, False]
    assert "carry" not in batch.keys()


# ----------------------------------------------------------------------------- loop reference, wrap-around

@pytest.mark.parametrize("prioritized", [False, True])
def test_sampleable_sequences_and_contents_match_reference_with_wraparound(prioritized):
    burn_in, seq_len, n, k, C, T, B, adds = 3, 5, 2, 5, 30, 7, 3, 14   # 98 rows per env: the ring wraps 3 times
    L = burn_in + seq_len + n
    episodes = RandomEpisodes(B, seed=3)
    rollouts = [with_carry(episodes.rollout(T)) for _ in range(adds)]
    buffer = sequence.init(rollouts[0], C * B, burn_in=burn_in, seq_len=seq_len, n_step=n, carry_interval=k,
                           prioritized=prioritized, alpha=0.7)
    g = torch.Generator().manual_seed(0)
    valid = torch.tensor(np.array(episodes.valid))
    done = torch.tensor(np.array(episodes.terminated) | np.array(episodes.truncated))
    for step, rollout in enumerate(rollouts, 1):
        buffer = sequence.add(buffer, rollout)
        allowed = reference_starts(step * T, C, k, L, B)
        assert sequence.num_sampleable(buffer) == len(allowed)
        assert sampleable_leaves(buffer) == allowed
        if not allowed:
            continue
        batch = sequence.sample(buffer, len(allowed), beta=0.5, generator=g)
        start, env = batch["time"][0], batch["index"][0] % B
        assert set(zip(start.tolist(), env.tolist())) <= allowed          # never across the cursor
        assert torch.equal(batch["time"], start + torch.arange(L).unsqueeze(1))
        assert torch.equal(batch["obs"][..., :2], torch.stack([batch["time"], env.expand(L, -1)], -1).float())
        assert torch.equal(batch["carry", "h"][0], torch.stack([start, env], -1).float())
        rows = batch["time"]
        assert torch.equal(batch["valid"], valid[rows, env]) and torch.equal(batch["done"], done[rows, env])
        reset = torch.cat([torch.ones(1, B, dtype=torch.bool), ~valid[:-1]])
        assert torch.equal(batch["reset"], reset[rows, env])
        for i in range(len(allowed)):
            assert batch["mask"][:, i].tolist() == reference_mask(batch["valid"][:, i], batch["done"][:, i],
                                                                  burn_in, seq_len)
        if prioritized:
            buffer = sequence.update_priorities(buffer, batch["index"][0], torch.rand(len(allowed), generator=g))


def test_uniform_sampling_is_uniform_over_sampleable_sequences():
    C, T, B, k = 40, 10, 3, 4
    episodes = RandomEpisodes(B, seed=4)
    buffer = sequence.init(episodes.rollout(T), C * B, burn_in=4, seq_len=8, n_step=3, carry_interval=k)
    episodes = RandomEpisodes(B, seed=4)
    for _ in range(7):
        buffer = sequence.add(buffer, episodes.rollout(T))
    allowed = sorted(reference_starts(70, C, k, 15, B))
    counts = {key: 0 for key in allowed}
    g = torch.Generator().manual_seed(5)
    for _ in range(300):
        batch = sequence.sample(buffer, len(allowed), generator=g)
        for key in zip(batch["time"][0].tolist(), (batch["index"][0] % B).tolist()):
            counts[key] += 1
    assert chisquare_pvalue(list(counts.values())) > 1e-3


# ----------------------------------------------------------------------------- priorities

def test_priorities_at_insertion_update_and_weights():
    """k = 4, L = 6, C = 16, one env. Rollouts of 8 rows carry their starts' priorities."""
    T, B = 8, 2
    episodes = RandomEpisodes(B, p_terminate=0.0, p_truncate=0.0, seed=6)
    buffer = sequence.init(episodes.rollout(T), 16 * B, burn_in=1, seq_len=3, n_step=2, carry_interval=4,
                           prioritized=True, alpha=0.5, priority_eps=0.0)
    episodes = RandomEpisodes(B, p_terminate=0.0, p_truncate=0.0, seed=6)
    buffer = sequence.add(buffer, episodes.rollout(T), priority=torch.tensor([4.0, 9.0]))      # [B]: starts 0, 4
    per_row = torch.zeros(T, B)
    per_row[0], per_row[4] = torch.tensor([16.0, 1.0]), torch.tensor([25.0, 36.0])
    buffer = sequence.add(buffer, episodes.rollout(T), priority=per_row)                         # [T, B]: starts 8, 12
    # stored p^alpha = sqrt(p); sampleable: starts 0, 4, 8 (8 + 6 <= 16), 12 not yet
    assert torch.allclose(buffer.slots["priority"], torch.tensor([[2., 3.], [2., 3.], [4., 1.], [5., 6.]]))
    assert sampleable_leaves(buffer) == {(a, b) for a in (0, 4, 8) for b in (0, 1)}
    assert float(buffer.max_priority) == 6.0
    leaves = sum_tree_get(buffer.tree, torch.arange(8)).float()
    assert torch.equal(leaves, torch.tensor([2., 3., 2., 3., 4., 1., 0., 0.]))
    batch = sequence.sample(buffer, 6, beta=1.0, generator=torch.Generator().manual_seed(0))
    p = leaves[batch["index"][0]]
    torch.testing.assert_close(batch["weight"][0], p.min() / p)
    buffer = sequence.update_priorities(buffer, torch.tensor([0, 5]), torch.tensor([-9.0, 49.0]))
    assert float(buffer.max_priority) == 7.0
    assert torch.equal(sum_tree_get(buffer.tree, torch.tensor([0, 5])).float(), torch.tensor([3.0, 7.0]))
    buffer = sequence.add(buffer, episodes.rollout(T))             # no priority: new starts get max = 7
    assert torch.allclose(buffer.slots["priority"][0], torch.tensor([7.0, 7.0]))   # start 16 took slot 0


def test_prioritized_sampling_follows_priorities():
    T, B = 8, 2
    episodes = RandomEpisodes(B, seed=7)
    buffer = sequence.init(episodes.rollout(T), 32 * B, burn_in=2, seq_len=4, n_step=2, carry_interval=4,
                           prioritized=True, alpha=1.0, priority_eps=0.0)
    for _ in range(4):
        buffer = sequence.add(buffer, episodes.rollout(T))
    index = torch.arange(8 * B)
    priority = torch.rand(8 * B, generator=torch.Generator().manual_seed(0)) + 0.1
    buffer = sequence.update_priorities(buffer, index, priority)
    ok = buffer.slots["sampleable"].flatten()
    g = torch.Generator().manual_seed(8)
    drawn = torch.cat([sequence.sample(buffer, int(ok.sum()), generator=g)["index"][0] for _ in range(300)])
    counts = torch.bincount(drawn, minlength=8 * B)
    assert (counts[~ok] == 0).all()
    expected = (priority * ok) / (priority * ok).sum() * drawn.numel()
    assert chisquare_pvalue(counts[ok].numpy(), expected[ok].numpy()) > 1e-3


# ----------------------------------------------------------------------------- frames, errors

def test_frame_dedup_rebuilds_envpool_stacks():
    T, steps = 32, 256
    rollouts, stacks, full = envpool_rollouts("Pong-v5", T, steps, max_episode_steps=40)
    buffer = sequence.init(rollouts[0], 2 * 96, burn_in=4, seq_len=8, n_step=2, carry_interval=8,
                           frame_dedup=True)
    assert buffer.storage["obs"].shape == (96, 2, 84, 84)
    checked = 0
    for i, rollout in enumerate(rollouts):
        buffer = sequence.add(buffer, rollout)
        if not sequence.can_sample(buffer, 8):
            continue
        batch = sequence.sample(buffer, 8, generator=torch.Generator().manual_seed(i))
        env = batch["index"][0] % 2
        assert torch.equal(batch["obs"], stacks[batch["time"], env])
        checked += 1
    assert checked >= 4 and int((~full["valid"]).sum()) >= 4


def test_errors():
    episodes = RandomEpisodes(2, seed=9)
    rollout = episodes.rollout(8)
    with pytest.raises(ValueError, match="multiple of carry_interval"):
        sequence.init(rollout, 2 * 30, burn_in=2, seq_len=8, n_step=2, carry_interval=8)
    with pytest.raises(ValueError, match="at least"):
        sequence.init(rollout, 2 * 16, burn_in=2, seq_len=8, n_step=2, carry_interval=8)
    buffer = sequence.init(rollout, 2 * 32, burn_in=2, seq_len=8, n_step=2, carry_interval=8)
    with pytest.raises(ValueError, match="carry"):
        sequence.add(buffer, with_carry(rollout))
    with pytest.raises(ValueError, match="sampleable"):
        sequence.sample(buffer, 1)
    with pytest.raises(ValueError, match="prioritized"):
        sequence.update_priorities(buffer, torch.zeros(1, dtype=torch.int64), torch.zeros(1))
    with pytest.raises(ValueError, match="priority must be"):
        sequence.add(buffer, rollout, priority=torch.zeros(3))
