"""Tests for fnrl.distributed.wire: layouts as tensors, and messages between three gloo processes
over loopback, received from any sender, without anything unpickled on the receiving side."""
import pickle

import pytest
import torch

from fnrl.distributed.wire import Layout, WireError
from tests.processes import run_ranks

WORLD = 3


def message(rank: int, k: int) -> dict:
    """Sender `rank`'s k-th message: every kind of field the wire carries, values from (rank, k)."""
    base = 100 * rank + k
    return {"obs": torch.arange(12, dtype=torch.float32).reshape(4, 3) + base,
            "action": torch.tensor([base, -base, 0, 7], dtype=torch.int64),
            "done": torch.tensor([k % 2 == 0, True, False, rank == 1]),
            "logp": torch.full((4,), base / 3, dtype=torch.float64),
            "half": torch.tensor([0.5, base], dtype=torch.bfloat16),
            "step": torch.tensor(base, dtype=torch.int32),
            "empty": torch.zeros(0, 5)}


def test_layout_round_trips_through_tensors():
    layout = Layout.of(message(1, 0))
    codes, names = layout.to_tensors()
    assert codes.dtype == torch.int64 and names.dtype == torch.uint8
    assert Layout.from_tensors(codes, names) == layout
    assert layout.digest == Layout.from_tensors(codes, names).digest
    other = Layout.of({**message(1, 0), "obs": torch.zeros(4, 2)})
    assert other.digest != layout.digest
    assert layout.offsets == (0, 48, 80, 88, 120, 128, 136, 136) and layout.nbytes == 136   # 8-byte aligned
    assert layout.size == 24 + 136   # the header, then the body
    sent = message(2, 3)
    unpacked = layout.unpack(layout.pack(sent))
    assert all(torch.equal(unpacked[k], sent[k]) and unpacked[k].dtype == sent[k].dtype for k in sent)


def test_bad_layouts_are_wire_errors():
    with pytest.raises(WireError, match="complex64"):
        Layout.of({"z": torch.zeros(2, dtype=torch.complex64)})
    codes, names = Layout.of(message(1, 0)).to_tensors()
    with pytest.raises(WireError, match="does not decode"):
        Layout.from_tensors(codes[:-1], names)
    with pytest.raises(WireError, match="does not decode"):
        Layout.from_tensors(codes, names[:3])


def _rank_main(rank, store, messages_each):
    import torch.distributed as dist

    from fnrl.distributed import wire

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    if rank == 0:
        def refuse(*args, **kwargs):
            raise AssertionError("the receiver unpickled something")

        pickle.loads = pickle.load = torch.load = refuse   # nothing received may go through them
        layouts = {src: wire.recv_layout(src) for src in (1, 2)}
        seen = {1: [], 2: []}
        for _ in range(2 * messages_each):
            sender, count, got = wire.recv(layouts[1])   # from whichever sender is first
            want = message(sender, count)
            assert list(got) == list(want)
            for name in want:
                assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), name
            seen[sender].append(count)
        assert seen == {1: list(range(messages_each)), 2: list(range(messages_each))}
        dist.send(torch.ones(1), 1)                      # tell sender 1 to send a message of another layout
        with_error = None
        try:
            wire.recv(layouts[1], src=1)
        except wire.WireError as e:
            with_error = str(e)
        assert with_error is not None and "another layout" in with_error
        _, count, _ = wire.recv(layouts[1], src=1)   # a signal: the header alone
        assert count == -7
    else:
        layout = wire.Layout.of(message(rank, 0))
        wire.send_layout(layout, 0)
        for k in range(messages_each):
            wire.send(message(rank, k), layout, 0, count=k)
        if rank == 1:
            dist.recv(torch.empty(1), 0)
            wrong = {"obs": torch.zeros(2, 2)}
            wire.send(wrong, wire.Layout.of(wrong), 0)
            wire.send_signal(layout, 0, count=-7)
    dist.barrier()
    dist.destroy_process_group()


def test_messages_from_two_senders_arrive_whole_and_in_each_senders_order(tmp_path):
    run_ranks(_rank_main, WORLD, (str(tmp_path / "store"), 5), timeout=120)


def test_a_message_must_match_its_layout():
    import torch.distributed  # noqa: F401  (send checks before any communication)

    from fnrl.distributed import wire

    layout = Layout.of(message(1, 0))
    with pytest.raises(WireError, match="'obs' is torch.float64"):
        wire.send({**message(1, 0), "obs": torch.zeros(4, 3, dtype=torch.float64)}, layout, dst=0)
