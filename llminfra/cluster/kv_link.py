"""A KV handoff on a ``torch.distributed`` link (gloo): the messages, the receiving thread, the
link's measured rate.

Each handoff is three point-to-point messages, sender → receiver::

    header int64[4] = [kind, meta bytes, kv elements, kv element bytes]
                                         kind: 1 handoff, 2 no more requests
    meta   uint8[...] = the pickled KVHandoff less its K/V (prompt, tokens, params, times, ...)
    kv     (2, L, T, H_kv, d) in the engine's dtype

The receiver reads on a thread of its own (:func:`recv_loop`: a gloo receive blocks, and gloo's
non-blocking receive cannot be polled), so its decode steps never wait for a transfer; the
sender sends synchronously (:func:`send_handoff`), so each handoff's transfer time is measured
there. A message the receiver cannot trust (a K/V payload shorter than its header, a K/V dtype
outside :data:`KV_DTYPES`, metadata that does not describe its K/V) is :class:`Refused`, never
adopted. Why gloo and not shared memory: it is the transport of a real deployment's shape (a
``torch.distributed`` group across machines; NCCL between GPUs) — only the link changes — and
the course never builds a transport of its own; shared memory would be faster on one machine
but would teach nothing that carries to two. Its rate is :func:`measure_link`. Used by
:mod:`llminfra.cluster.disagg_process`; taught in chapter 11.
"""

from __future__ import annotations

import math
import pickle
import queue
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from llminfra.cluster.kv_transfer import KVHandoff

HANDOFF, DONE = 1, 2
#: message sizes (bytes) of the link measurement
LINK_SIZES = (2**20, 2**22, 2**24)
#: the receive buffer of a header (bytes): a header is 32, but gloo aborts the process when a
#: message is longer than the buffer posted for it, so a message out of step must fit here
HEADER_BUFFER_BYTES = 4096
#: the largest metadata and K/V messages a decode worker accepts (bytes)
MAX_META_BYTES = 2**24
MAX_KV_BYTES = 2**34
#: K/V dtypes a handoff may carry (an integer K/V would be cast silently into wrong values)
KV_DTYPES = {str(t): t for t in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}

#: the malformed handoffs a test can ask the prefill worker to send (``corrupt_handoffs``)
CORRUPTIONS = ("short", "unknown_kind", "unknown_header", "int64")


def send_handoff(h: KVHandoff, dst: int, corrupt: str | None = None) -> None:
    """Header, metadata, K/V. ``corrupt`` (tests only, :data:`CORRUPTIONS`): ``"short"`` sends
    one token less K/V than the header says, ``"unknown_kind"`` sends the whole handoff under
    kind 9, ``"unknown_header"`` sends a lone header of kind 9 before the real handoff,
    ``"int64"`` sends the K/V as int64."""
    kv = h.kv.to(torch.int64) if corrupt == "int64" else h.kv
    meta = pickle.dumps((replace(h, kv=torch.empty(0)), tuple(kv.shape), str(kv.dtype)))
    kind = 9 if corrupt == "unknown_kind" else HANDOFF
    if corrupt == "unknown_header":
        dist.send(torch.tensor([9, 0, 0, 0]), dst=dst)
    dist.send(torch.tensor([kind, len(meta), kv.numel(), kv.element_size()]), dst=dst)
    dist.send(torch.frombuffer(bytearray(meta), dtype=torch.uint8), dst=dst)
    dist.send((kv[:, :, :-1] if corrupt == "short" else kv).contiguous(), dst=dst)


def send_done(dst: int) -> None:
    """The header that ends a link: no more handoffs (:func:`recv_loop` puts ``DONE``)."""
    dist.send(torch.tensor([DONE, 0, 0, 0]), dst=dst)


class Refused:
    """A handoff the decode worker read but will not adopt (``handoff`` None when even its
    metadata could not be read), and why."""

    def __init__(self, reason: str, handoff: KVHandoff | None = None):
        self.reason, self.handoff = reason, handoff


def _recv_bytes(n: int, src: int) -> torch.Tensor:
    buf = torch.empty(n, dtype=torch.uint8)
    if n:
        dist.recv(buf, src=src)
    return buf


def recv_loop(src: int, inbox: queue.Queue) -> None:
    """The decode rank's receiving thread: handoffs into ``inbox`` (or :class:`Refused` ones:
    a K/V payload shorter than its header, a K/V dtype outside :data:`KV_DTYPES`, metadata that
    does not describe its K/V; a message of unknown kind is read as its header declares and
    skipped), then ``DONE``, or the exception that ended the link. Every receive posts a buffer
    at least as large as the message the header declares (gloo aborts the process on a longer
    one), and the K/V buffer is filled with NaN first: a shorter payload leaves NaN behind."""
    try:
        while True:
            raw = torch.zeros(HEADER_BUFFER_BYTES, dtype=torch.uint8)
            dist.recv(raw, src=src)
            kind, meta_bytes, kv_elems, kv_itemsize = raw[:32].view(torch.int64).tolist()
            if kind == DONE:
                inbox.put(DONE)
                return
            sizes_ok = (0 <= meta_bytes <= MAX_META_BYTES and 0 <= kv_elems
                        and 0 <= kv_itemsize <= 16 and kv_elems * kv_itemsize <= MAX_KV_BYTES)
            if not sizes_ok:
                raise ConnectionError(f"a header declares {meta_bytes} metadata bytes and "
                                      f"{kv_elems} K/V values of {kv_itemsize} bytes: out of "
                                      f"range, so the link is out of step; nothing more is "
                                      f"read from it")
            meta = _recv_bytes(meta_bytes, src)
            if kind != HANDOFF:
                _recv_bytes(kv_elems * kv_itemsize, src)       # read as declared: in step
                inbox.put(Refused(f"a message of unknown kind {kind} (expected {HANDOFF} or "
                                  f"{DONE}) was skipped"))
                continue
            inbox.put(_recv_kv(meta, kv_elems, kv_itemsize, src))
    except Exception as err:  # noqa: BLE001 - the prefill rank is gone: reported, not raised
        inbox.put(err)


def _recv_kv(meta: torch.Tensor, kv_elems: int, kv_itemsize: int, src: int):
    """The K/V message of one handoff, checked against its metadata and header."""
    try:
        h, shape, dtype = pickle.loads(meta.numpy().tobytes())
        if not isinstance(h, KVHandoff):
            raise TypeError(f"the metadata holds a {type(h).__name__}, not a KVHandoff")
    except Exception as err:  # noqa: BLE001 - unreadable metadata: this handoff is refused
        _recv_bytes(kv_elems * kv_itemsize, src)
        return Refused(f"a handoff's metadata cannot be read: {type(err).__name__}: {err}")
    if dtype not in KV_DTYPES or math.prod(shape) != kv_elems \
            or KV_DTYPES[dtype].itemsize != kv_itemsize:
        _recv_bytes(kv_elems * kv_itemsize, src)
        why = (f"its K/V dtype {dtype} is not one of {', '.join(KV_DTYPES)}"
               if dtype not in KV_DTYPES else
               f"its metadata describes K/V {tuple(shape)} {dtype}, its header {kv_elems} "
               f"values of {kv_itemsize} bytes")
        return Refused(f"handoff of request {h.request_id!r} refused: {why}", h)
    kv = torch.full(shape, math.nan, dtype=KV_DTYPES[dtype])
    if kv_elems:
        dist.recv(kv, src=src)
    missing = int(torch.isnan(kv).sum())
    if missing:
        return Refused(f"handoff of request {h.request_id!r} refused: its K/V payload was "
                       f"shorter than its header ({missing} of {kv_elems} values never "
                       f"arrived, or NaN)", h)
    return replace(h, kv=kv)


def measure_link(rank: int, sizes=LINK_SIZES) -> dict:
    """MB/s (1e6 bytes) of one gloo send of each size, rank 0 → 1, timed on rank 0 until a
    one-element acknowledgement returns (rank 1 gets ``{}``); after a barrier, so that a peer
    still loading its model is not timed."""
    dist.barrier()                    # both ranks up (the model loads first): time only sends
    out, ack = {}, torch.zeros(1)
    for n in sizes:
        x = torch.ones(n // 4)
        if rank == 0:
            t = time.monotonic()
            dist.send(x, dst=1)
            dist.recv(ack, src=1)
            out[str(n)] = n / 1e6 / (time.monotonic() - t)
        else:
            dist.recv(x, src=0)
            dist.send(ack, dst=0)
    return out
