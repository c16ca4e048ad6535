"""fnrl.episodes: the trailing mean return, the interval columns and the stop rule."""
import math

import pytest
import torch
from tensordict import TensorDict

from fnrl.episodes import EpisodeStats, returns_by_row


def test_return_mean_is_the_mean_of_the_last_hundred_episodes():
    stats = EpisodeStats()
    stats.add([[float(g) for g in range(1, 151)]])
    (row,) = stats.columns()
    assert row["return_mean"] == pytest.approx(sum(range(51, 151)) / 100)   # 100.5
    assert row["return_interval"] == pytest.approx(75.5) and row["episodes"] == 150
    assert stats.finished == [150]


def test_return_mean_stays_defined_in_intervals_without_episodes():
    stats = EpisodeStats(rows=2)
    assert all(math.isnan(r["return_mean"]) for r in stats.columns())    # nothing finished yet
    stats.add([[10.0, 20.0], []])
    first = stats.columns()
    assert first[0] == {"return_mean": 15.0, "return_interval": 15.0, "episodes": 2}
    assert math.isnan(first[1]["return_mean"]) and first[1]["episodes"] == 0
    stats.add([[], [7.0]])
    second = stats.columns()
    assert second[0]["return_mean"] == 15.0 and math.isnan(second[0]["return_interval"])
    assert second[0]["episodes"] == 0 and second[1]["return_mean"] == 7.0


def test_the_stop_rule_needs_twenty_episodes_of_every_row():
    stats = EpisodeStats(rows=2)
    stats.add([[500.0] * 19, [500.0] * 30])
    assert not stats.reached(475.0)                 # row 0 has 19 episodes
    stats.add([[500.0], []])
    assert stats.reached(475.0)
    stats.add([[], [0.0] * 10])                     # row 1's trailing mean: (30 * 500) / 40 = 375
    assert not stats.reached(475.0)
    assert not stats.reached(None)


def test_state_dict_round_trip_keeps_the_window():
    stats = EpisodeStats(rows=2, window=3)
    stats.add([[1.0, 2.0, 3.0, 4.0], [5.0]])
    again = EpisodeStats(rows=2, window=3)
    again.load_state_dict(stats.state_dict())
    assert again.means() == [3.0, 5.0] and again.finished == [4, 1]
    with pytest.raises(ValueError):
        EpisodeStats(rows=1).load_state_dict(stats.state_dict())


def test_returns_by_row_equals_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    T, R, B = 5, 3, 4
    ended = torch.rand(T, R * B, generator=g) < 0.3
    returns = torch.randn(T, R * B, generator=g)
    rollout = TensorDict({"episode_end": ended, "episode_return": returns}, batch_size=[T, R * B])
    expected = [[] for _ in range(R)]
    for t in range(T):
        for j in range(R * B):
            if ended[t, j]:
                expected[j // B].append(float(returns[t, j]))
    assert returns_by_row(rollout, R) == expected
    assert returns_by_row(rollout) == [[float(returns[t, j]) for t in range(T) for j in range(R * B) if ended[t, j]]]
