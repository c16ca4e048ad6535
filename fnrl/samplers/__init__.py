"""Samplers turn a policy's `act` and a batched env into [T, B] rollouts."""
from fnrl.samplers.serial import SerialSampler

__all__ = ["SerialSampler"]
