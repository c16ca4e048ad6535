"""Tensors-only messages between processes over torch.distributed point-to-point (gloo, NCCL).

The transport under hosts on other machines: a message is a flat dict {name: tensor} whose
`Layout` (names, dtypes, shapes, in order) both ends agree on once, and on the wire it is one
uint8 tensor of `layout.size` bytes (tag MESSAGE):

    header   int64 [3]: MAGIC, the layout's digest, the sender's message count
    body     the fields' bytes in the layout's order, each starting at a multiple of 8 bytes

One send per message: a header and a body sent apart cost gloo several times the round trip
of one send on loopback. A signal (`send_signal`) is a header alone; a receive takes a message
no longer than its buffer, so it reads a signal's count and leaves the fields unset.

`send_layout` / `recv_layout` agree on the layout in tensors too: int64 codes for the dtypes and
shapes and the names' UTF-8 bytes. Nothing received is ever unpickled (no object collectives, no
`torch.load`): the receiver only writes into tensors it allocated from the layout, so a peer can
corrupt its numbers but never run code in it. A header whose magic or digest is not the
layout's is a `WireError`. (A message longer than the receiver's layout ends the receiving
process: gloo aborts, which is why the layouts are agreed first.) The received fields are views
of one buffer per message (no copy).

    layout = Layout.of({"obs": obs, "reward": reward})
    send_layout(layout, dst=0)                       # an actor, once
    send({"obs": obs, "reward": reward}, layout, dst=0)
    layout = recv_layout(src=1)                      # the learner
    sender, count, message = recv(layout)            # from whichever sender is first (gloo)
"""
from __future__ import annotations

import functools
import hashlib
import math
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

MAGIC = 0x666E726C   # "fnrl"
MESSAGE, LAYOUT = 7001, 7003
"""The tags of messages and of layouts."""
HEADER_BYTES = 3 * 8
"""The header's bytes at the start of every message."""
LOOPBACK = "lo"
"""The network interface gloo connects the ranks of one machine over (`GLOO_SOCKET_IFNAME`)."""
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
"""The dtypes a message may carry; a dtype's code on the wire is its index here."""


class WireError(RuntimeError):
    """A message that does not match the agreed layout (a wrong peer, version or order)."""


@dataclass(frozen=True)
class Layout:
    """The fields of a message: names, dtypes and shapes, in the order they travel."""

    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, message: dict) -> "Layout":
        """The layout of `message` ({name: tensor}, in its order)."""
        for name, t in message.items():
            if t.dtype not in DTYPES:
                raise WireError(f"field {name!r} has dtype {t.dtype}, which the wire does not carry ({DTYPES})")
        return cls(tuple(message), tuple(t.dtype for t in message.values()),
                   tuple(tuple(t.shape) for t in message.values()))

    @functools.cached_property
    def digest(self) -> int:
        """A 62-bit digest of the layout: a header carries it, and a receiver checks it."""
        codes, names = self.to_tensors()
        return int.from_bytes(hashlib.blake2b(codes.numpy().tobytes() + names.numpy().tobytes(),
                                              digest_size=8).digest(), "little") >> 2

    def to_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes int64 [...], names uint8 [...]): per field its dtype code, rank and sizes, and the
        names' UTF-8 bytes, each name ended by a 0 byte."""
        codes = [len(self.names)]
        for dtype, shape in zip(self.dtypes, self.shapes):
            codes += [DTYPES.index(dtype), len(shape), *shape]
        names = b"".join(n.encode() + b"\0" for n in self.names)
        return torch.tensor(codes, dtype=torch.int64), torch.frombuffer(bytearray(names), dtype=torch.uint8)

    @classmethod
    def from_tensors(cls, codes: torch.Tensor, names: torch.Tensor) -> "Layout":
        """The inverse of `to_tensors`; a WireError where the tensors do not describe a layout."""
        c = codes.tolist()
        words = bytes(names.tolist()).split(b"\0")[:-1]
        try:
            dtypes, shapes, i = [], [], 1
            for _ in range(c[0]):
                rank = c[i + 1]
                dtypes.append(DTYPES[c[i]])
                shapes.append(tuple(c[i + 2:i + 2 + rank]))
                i += 2 + rank
            text = tuple(w.decode() for w in words)
        except (IndexError, UnicodeDecodeError) as e:
            raise WireError(f"a layout that does not decode: {e}") from None
        if i != len(c) or len(text) != c[0] or any(d < 0 for s in shapes for d in s):
            raise WireError("a layout that does not decode: its codes and names disagree")
        return cls(text, tuple(dtypes), tuple(shapes))

    @functools.cached_property
    def offsets(self) -> tuple[int, ...]:
        """Where each field starts in the body, in bytes (multiples of 8, so every field's view is aligned)."""
        out, at = [], 0
        for dtype, shape in zip(self.dtypes, self.shapes):
            out.append(at)
            at += -(-math.prod(shape) * dtype.itemsize // 8) * 8
        return tuple(out + [at])

    @property
    def nbytes(self) -> int:
        """The body's size in bytes."""
        return self.offsets[-1]

    @property
    def size(self) -> int:
        """A message's size on the wire in bytes: the header and the body."""
        return HEADER_BYTES + self.nbytes

    def pack(self, message: dict) -> torch.Tensor:
        """The message: uint8 [size], the fields after room for the header (written by `send_packed`)."""
        packed, at = torch.zeros(self.size, dtype=torch.uint8), [HEADER_BYTES + o for o in self.offsets]
        for i, (name, dtype, shape) in enumerate(zip(self.names, self.dtypes, self.shapes)):
            t = message[name]
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise WireError(f"field {name!r} is {t.dtype} {list(t.shape)}, the layout says {dtype} {list(shape)}")
            n = t.numel() * dtype.itemsize
            packed[at[i]:at[i] + n] = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return packed

    def unpack(self, packed: torch.Tensor) -> dict:
        """The fields of a message (`pack`'s layout), as views of it: {name: tensor}."""
        at = [HEADER_BYTES + o for o in self.offsets]
        return {name: packed[at[i]:at[i] + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
                for i, (name, dtype, shape) in enumerate(zip(self.names, self.dtypes, self.shapes))}


def send_layout(layout: Layout, dst: int, group=None) -> None:
    """Send `layout` to rank `dst` (sizes, then codes and names)."""
    codes, names = layout.to_tensors()
    dist.send(torch.tensor([codes.numel(), names.numel()]), dst, group=group, tag=LAYOUT)
    dist.send(codes, dst, group=group, tag=LAYOUT)
    dist.send(names, dst, group=group, tag=LAYOUT)


def recv_layout(src: int, group=None, max_bytes: int = 1 << 20) -> Layout:
    """Receive the layout rank `src` sends with `send_layout` (at most `max_bytes` of it)."""
    sizes = torch.empty(2, dtype=torch.int64)
    dist.recv(sizes, src, group=group, tag=LAYOUT)
    n_codes, n_names = sizes.tolist()
    if not (0 < n_codes and 0 <= n_names and 8 * n_codes + n_names <= max_bytes):
        raise WireError(f"a layout of {n_codes} codes and {n_names} name bytes is refused (limit {max_bytes} bytes)")
    codes, names = torch.empty(n_codes, dtype=torch.int64), torch.empty(n_names, dtype=torch.uint8)
    dist.recv(codes, src, group=group, tag=LAYOUT)
    dist.recv(names, src, group=group, tag=LAYOUT)
    return Layout.from_tensors(codes, names)


def send(message: dict, layout: Layout, dst: int, count: int = 0, group=None) -> None:
    """Send `message` (the fields of `layout`, in any order) to rank `dst` in one send.
    `count`: the sender's message number, which the receiver gets back from the header."""
    send_packed(layout.pack(message), layout, dst, count, group)


def send_packed(packed: torch.Tensor, layout: Layout, dst: int, count: int = 0, group=None) -> None:
    """`send` of a message already packed (`layout.pack`); writes its header in place."""
    packed[:HEADER_BYTES].view(torch.int64).copy_(torch.tensor([MAGIC, layout.digest, count]))
    dist.send(packed, dst, group=group, tag=MESSAGE)


def send_signal(layout: Layout, dst: int, count: int, group=None) -> None:
    """A header alone: the receiver's `recv` gets `count` and fields left unset (a signal, such as a
    stop, that both ends agree on)."""
    dist.send(torch.tensor([MAGIC, layout.digest, count], dtype=torch.int64).view(torch.uint8), dst, group=group,
              tag=MESSAGE)


def recv(layout: Layout, src: int | None = None, group=None) -> tuple[int, int, dict]:
    """Receive one message of `layout` from rank `src`, or from whichever rank sends first (None;
    gloo): (sender rank, the sender's message count, {name: tensor}, views of one new buffer).
    A WireError if its header is not that layout's."""
    packed = torch.empty(layout.size, dtype=torch.uint8)
    sender = dist.recv(packed, src, group=group, tag=MESSAGE)
    magic, digest, count = packed[:HEADER_BYTES].view(torch.int64).tolist()
    if magic != MAGIC or digest != layout.digest:
        raise WireError(f"rank {sender} sent a message of another layout (magic {magic:#x}, digest {digest}; "
                        f"expected {MAGIC:#x}, {layout.digest}); both ends must agree on it with send_layout")
    return sender, count, layout.unpack(packed)


class Inbox:
    """Every message of `layout` from rank `src`, received on a daemon thread and handed to
    `deliver(count, fields)` there, in order.

    A blocking receive per sender (gloo's works cannot be polled): a sender that dies ends the
    thread with `error` set (its connection closes), without holding up other senders' inboxes.
    """

    def __init__(self, layout: Layout, src: int, deliver, group=None):
        self.layout, self.src, self.deliver, self.group = layout, src, deliver, group
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name=f"fnrl-inbox-{src}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                _, count, fields = recv(self.layout, self.src, self.group)
                self.deliver(count, fields)
        except BaseException as e:  # noqa: BLE001 - the owner reads it
            self.error = f"{type(e).__name__}: {e}".splitlines()[0]


class Outbox:
    """Send the newest message `put` here to rank `dst` on a daemon thread: one put while the
    previous message is still on its way replaces any older one not yet sent, so a slow receiver
    gets fewer messages and never holds up the sender. `error` is set once a send fails."""

    def __init__(self, layout: Layout, dst: int, group=None):
        self.layout, self.dst, self.group = layout, dst, group
        self.error: str | None = None
        self._next = None
        self._closed = False
        self._ready = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=f"fnrl-outbox-{dst}", daemon=True)
        self.thread.start()

    def put(self, packed: torch.Tensor, count: int) -> None:
        """Queue a packed message (`layout.pack`; not copied, so do not write to it afterwards, nor
        put it in another outbox: the send writes its header in place)."""
        with self._ready:
            self._next = (packed, count)
            self._ready.notify()

    def close(self, timeout: float = 1.0) -> None:
        """Send nothing more; wait up to `timeout` s for a send on its way to end."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            while True:
                with self._ready:
                    while self._next is None and not self._closed:
                        self._ready.wait()
                    if self._closed:
                        return
                    packed, count = self._next
                    self._next = None
                send_packed(packed, self.layout, self.dst, count, self.group)
        except BaseException as e:  # noqa: BLE001 - the owner reads it
            self.error = f"{type(e).__name__}: {e}".splitlines()[0]

