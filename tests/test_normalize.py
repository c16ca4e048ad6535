import torch

from fnrl.normalize import forward_return, rms_init, rms_normalize, rms_update, scale_rewards


def test_running_stats_match_whole_batch_statistics():
    torch.manual_seed(0)
    data = torch.randn(300, 3, dtype=torch.float64) * torch.tensor([1.0, 5.0, 0.1], dtype=torch.float64) + 2.0
    rms = rms_init((3,), torch.float64)
    for chunk in data.split(37):
        rms = rms_update(rms, chunk)
    torch.testing.assert_close(rms["mean"], data.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rms["var"], data.var(0, unbiased=False), rtol=1e-4, atol=1e-6)
    assert abs(rms["count"].item() - 300) < 1e-3


def test_hand_example_and_mask():
    rms = rms_init((), torch.float64)
    rms = rms_update(rms, torch.tensor([1.0, 3.0, 100.0], dtype=torch.float64), torch.tensor([True, True, False]))
    assert abs(rms["mean"].item() - 2.0) < 1e-3  # (1 + 3) / 2, the masked 100 ignored
    assert abs(rms["var"].item() - 1.0) < 1e-3
    x = torch.tensor([4.0], dtype=torch.float64)
    assert abs(rms_normalize(rms, x).item() - 2.0) < 1e-3  # (4 - 2) / 1
    assert rms_normalize(rms, torch.tensor([1e9], dtype=torch.float64)).item() == 10.0  # clipped


def test_forward_return_matches_a_plain_loop_across_rollouts():
    torch.manual_seed(1)
    T, B, gamma = 7, 3, 0.9
    reward = torch.randn(2 * T, B, dtype=torch.float64)
    done = torch.rand(2 * T, B) < 0.2
    expected, running = torch.zeros(2 * T, B, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    for t in range(2 * T):  # R_t = r_t + gamma R_{t-1}, restarted after every done step
        running = reward[t] + running
        expected[t] = running
        running = gamma * running * (~done[t])
    carry = torch.zeros(B, dtype=torch.float64)
    first, carry = forward_return(reward[:T], done[:T], gamma, carry)
    second, carry = forward_return(reward[T:], done[T:], gamma, carry)
    torch.testing.assert_close(torch.cat([first, second]), expected)
    torch.testing.assert_close(carry, running)


def test_scale_rewards_by_hand():
    # one env, gamma 0.5: returns 2, 1 + 0.5 * 2 = 2, then 4 after the episode ended; the masked third step is
    # left out of the statistics: mean 2, var 0 (count 1e-4 + 2), so rewards are divided by sqrt(~0 + 1e-8)
    reward = torch.tensor([[2.0], [1.0], [4.0]], dtype=torch.float64)
    done = torch.tensor([[False], [True], [False]])
    valid = torch.tensor([[True], [True], [False]])
    rms, ret = rms_init((), torch.float64), torch.zeros(1, dtype=torch.float64)
    scaled, rms, ret = scale_rewards(rms, ret, reward, done, valid, 0.5)
    assert abs(rms["mean"].item() - 2.0) < 1e-3 and rms["var"].item() < 1e-3
    torch.testing.assert_close(ret, torch.tensor([2.0], dtype=torch.float64))  # 0.5 * 4, carried on
    torch.testing.assert_close(scaled, reward / torch.sqrt(rms["var"] + 1e-8))
    # a second rollout: returns 2 + 2 = 4 and 4 * 0.5 + 0 = 2 merge into the statistics
    scaled, rms, ret = scale_rewards(rms, ret, torch.tensor([[2.0], [0.0]], dtype=torch.float64),
                                     torch.zeros(2, 1, dtype=torch.bool), torch.ones(2, 1, dtype=torch.bool), 0.5)
    returns = torch.tensor([2.0, 2.0, 4.0, 2.0], dtype=torch.float64)
    assert abs(rms["var"].item() - returns.var(unbiased=False).item()) < 1e-3
    expected = torch.tensor([[2.0], [0.0]], dtype=torch.float64) / torch.sqrt(rms["var"] + 1e-8)
    torch.testing.assert_close(scaled, expected)
