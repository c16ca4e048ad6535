import torch

from fnrl.normalize import rms_init, rms_normalize, rms_update


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
