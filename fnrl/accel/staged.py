"""An update written as stages, run the fastest way the device allows.

An algorithm states what one update is, as pure functions:

    iteration(pieces, *args)     pieces = (prepare, steps(step), finish)

`prepare` computes what every minibatch step needs (advantages, targets), `steps(step)` runs
every minibatch step `step` in order (a scan, `fnrl.algos.common.scan_steps`) and `finish` what
comes after (PPO's adaptive KL coefficient). `staged_update` decides how they run:

- `compile=False`: eagerly;
- compiled: each piece under `torch.compile` (the scan of steps inside one graph);
- where `scan_on(device)` is False (a GPU): the steps as a Python loop of one compiled step,
  which `fnrl train --cuda-graphs` replays as one CUDA graph (`fnrl.accel.cudagraphs`);
- ahead of time, where `fnrl.accel.aot.serves` the device (the CPU): the whole iteration as one
  AOTInductor model, built at the first call and used while later calls match its layout.

The measurements behind these choices are in docs/decisions.md.
"""
from __future__ import annotations

from typing import Callable

import torch

from fnrl.accel import aot
from fnrl.accel.inductor import compile_on_first_call


def scan_on(device: torch.device) -> bool:
    """Whether a compiled update runs its minibatch steps as one `scan` on `device` (the CPU),
    or as a Python loop of one compiled minibatch step (CUDA).

    On the CPU the scan saves TorchDynamo's guard check and Python between the minibatch
    steps. On a GPU that host time overlaps the kernels, and `fnrl train --cuda-graphs` replays
    the whole loop as one launch (`fnrl.accel.cudagraphs.GraphedUpdate`): the loop is the path
    checked on a GPU (`tests/test_cudagraphs.py`)."""
    return device.type != "cuda"


def staged_update(iteration: Callable, prepare: Callable, steps: Callable, step: Callable, finish: Callable, *,
                  compile: bool, ahead_of_time: bool = True, subject: str = "the update is",
                  export_args: Callable | None = None) -> Callable:
    """`run(device, *args) -> iteration(pieces, *args)`, with the pieces run as the module
    docstring says for `device`.

    ahead_of_time: whether the iteration may be exported as one model (False, e.g., for a
        recurrent policy's unrolls, or `AccelOptions.ahead_of_time` off); only with `compile`.
    subject: how the one-line warning names the update if its model cannot be built.
    export_args: `args` as the exported model takes them (default: as they are), e.g. without a
        tensor that aliases another one."""
    pieces = traceable = (prepare, steps(step), finish)
    loop_pieces = None
    if compile:
        pieces = tuple(compile_on_first_call(f, fullgraph=True, dynamic=False) for f in pieces)
        loop_pieces = (pieces[0], steps(compile_on_first_call(step, fullgraph=True, dynamic=False)), pieces[2])
    whole = None   # the iteration as one AOTInductor model (`aot.AotFunction`), built at the first call
    exporting = compile and ahead_of_time

    def run(device: torch.device, *args):
        nonlocal whole, exporting
        if loop_pieces is not None and not scan_on(device):
            return iteration(loop_pieces, *args)
        if exporting and aot.serves(device):
            model_args = export_args(*args) if export_args is not None else args
            if whole is None:
                whole = aot.function_or_none(subject, lambda *a: iteration(traceable, *a), model_args)
                exporting = whole is not None
            if exporting:
                matched, out = whole.call_if_matches(*model_args)
                if matched:
                    return out
        return iteration(pieces, *args)

    return run
