"""fnrl: functional deep reinforcement learning for PyTorch."""

__version__ = "0.1.0"
