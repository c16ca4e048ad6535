"""fnrl: functional deep reinforcement learning for PyTorch."""
from fnrl.accel import inductor as _inductor  # noqa: F401  (settings compiled steps need on some torch versions)

__version__ = "0.1.0"
