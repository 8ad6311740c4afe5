"""A KV handoff on a ``torch.distributed`` link (gloo): the messages, the receiving thread, the
link's measured rate.

Each handoff is three point-to-point messages, sender → receiver::

    header int64[5] = [MAGIC, kind, meta bytes, kv elements, kv element bytes]
                              kind: 1 handoff, 2 no more requests
    meta   uint8[...] = JSON (UTF-8): the KVHandoff less its K/V values, with their shape and
                        dtype name (:func:`~llminfra.cluster.kv_transfer.handoff_meta`)
    kv     (2, L, T, H_kv, d) in the engine's dtype

The receiver trusts nothing its peer sends. The metadata is data only — JSON, never a pickle,
whose loading runs whatever callable the sender names — and every field is checked
(:func:`~llminfra.cluster.kv_transfer.handoff_from_meta`): types, ranges, the dtype name
against :data:`KV_DTYPES`, a shape whose product is the header's element count and an element
size that is the dtype's. A handoff that fails any check is :class:`Refused` with the reason
(its request fails alone; the decode worker goes on), never adopted.

Staying in step is the other half. gloo aborts the whole process when a message is longer than
the buffer posted for it, so each receive posts the most the sender can be sending: a header
buffer of :data:`HEADER_BUFFER_BYTES`, and for a K/V the larger of what the header's count
allows at any element size up to :data:`MAX_ELEMENT_BYTES` and what the metadata describes. A
header with element size 0 and a non-zero count is then one refused handoff, not a K/V read
as the next header. A header whose magic is wrong or whose sizes are past the limits means the
link is out of step: the thread reports that (a ``ConnectionError``), reads nothing more, and
the decode worker finishes what it had adopted. What no receiver on gloo can survive is a peer
whose header and metadata agree but whose K/V message is longer than both say: gloo cannot be
asked how long a message is before it is read. That is the transport's limit; over a network
the link would also need authentication (a shared-secret MAC per message), which it has not.

The receiver reads on a thread of its own (:func:`recv_loop`: a gloo receive blocks, and
gloo's non-blocking receive cannot be polled), so its decode steps never wait for a transfer;
the sender sends synchronously (:func:`send_handoff`), so each handoff's transfer time is
measured there. Why gloo and not shared memory: it is the transport of a real deployment's
shape (a ``torch.distributed`` group across machines; NCCL between GPUs) — only the link
changes — and the course never builds a transport of its own; shared memory would be faster
on one machine but would teach nothing that carries to two. Its rate is :func:`measure_link`.
Used by :mod:`llminfra.cluster.disagg_process`; taught in chapter 11.
"""

from __future__ import annotations

import json
import math
import queue
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from llminfra.cluster.kv_transfer import KV_DTYPES, KVHandoff, handoff_from_meta, handoff_meta
from llminfra.engine.sampling_params import clip

HANDOFF, DONE = 1, 2
#: the first field of every header ("LLKV" in ASCII): a K/V or metadata read as a header
#: instead shows that the link is out of step
MAGIC = 0x4C4C4B56
HEADER_FIELDS = 5
#: message sizes (bytes) of the link measurement
LINK_SIZES = (2**20, 2**22, 2**24)
#: the receive buffer of a header (bytes): a header is 40, but gloo aborts the process when a
#: message is longer than the buffer posted for it, so a message out of step must fit here
HEADER_BUFFER_BYTES = 4096
#: the largest metadata and K/V messages a decode worker accepts (bytes)
MAX_META_BYTES = 2**24
MAX_KV_BYTES = 2**34
#: the largest element a sender could mean (complex128): a K/V buffer holds the header's count
#: at this size, whatever element size the header claims
MAX_ELEMENT_BYTES = 16

#: the malformed handoffs a test can ask the prefill worker to send (``corrupt_handoffs``);
#: ``"pickle:PATH"`` also (:func:`pickled_system_call`)
CORRUPTIONS = ("short", "unknown_kind", "unknown_header", "int64", "zero_itemsize",
               "bad_shape", "not_json")


def pickled_system_call(command: str) -> bytes:
    """A pickle (protocol 0) whose loading runs ``os.system(command)``: what a hostile peer
    would send a receiver that unpickles. Tests only (``"pickle:PATH"`` sends one that
    creates the file PATH); ``command`` must not hold a newline or a backslash."""
    if "\n" in command or "\\" in command:
        raise ValueError(f"command must not hold a newline or a backslash, got {command!r}")
    return b"cos\nsystem\n(V" + command.encode() + b"\ntR."


def _corrupt_meta(meta: bytes, corrupt: str | None) -> bytes:
    if corrupt == "not_json":
        return b"\x80\x04not json"
    if corrupt is not None and corrupt.startswith("pickle:"):
        return pickled_system_call(f"touch '{corrupt[len('pickle:'):]}'")
    if corrupt == "bad_shape":
        obj = json.loads(meta)
        obj["kv"]["shape"][2] += 1                  # one token more than the K/V sent
        return json.dumps(obj).encode()
    return meta


def send_handoff(h: KVHandoff, dst: int, corrupt: str | None = None) -> None:
    """Header, metadata, K/V. ``corrupt`` (tests only, :data:`CORRUPTIONS`): ``"short"`` sends
    one token less K/V than the header says, ``"unknown_kind"`` sends the whole handoff under
    kind 9, ``"unknown_header"`` sends a lone header of kind 9 before the real handoff,
    ``"int64"`` sends the K/V as int64, ``"zero_itemsize"`` a header of element size 0 (the
    K/V sent in full), ``"bad_shape"`` metadata of one token more than the K/V, ``"not_json"``
    metadata that is not JSON, ``"pickle:PATH"`` a pickled ``os.system`` as metadata."""
    kv = h.kv.to(torch.int64) if corrupt == "int64" else h.kv
    meta = _corrupt_meta(json.dumps(handoff_meta(replace(h, kv=kv))).encode(), corrupt)
    kind = 9 if corrupt == "unknown_kind" else HANDOFF
    if corrupt == "unknown_header":
        dist.send(torch.tensor([MAGIC, 9, 0, 0, 0]), dst=dst)
    itemsize = 0 if corrupt == "zero_itemsize" else kv.element_size()
    dist.send(torch.tensor([MAGIC, kind, len(meta), kv.numel(), itemsize]), dst=dst)
    dist.send(torch.frombuffer(bytearray(meta), dtype=torch.uint8), dst=dst)
    dist.send((kv[:, :, :-1] if corrupt == "short" else kv).contiguous(), dst=dst)


def send_done(dst: int) -> None:
    """The header that ends a link: no more handoffs (:func:`recv_loop` puts ``DONE``)."""
    dist.send(torch.tensor([MAGIC, DONE, 0, 0, 0]), dst=dst)


class Refused:
    """A handoff the decode worker read but will not adopt, and why: ``handoff`` is None when
    its metadata could not be read, ``request_id`` None when not even that could be."""

    def __init__(self, reason: str, handoff: KVHandoff | None = None,
                 request_id: str | None = None):
        self.reason, self.handoff = reason, handoff
        self.request_id = handoff.request_id if handoff is not None else request_id


def _recv_bytes(n: int, src: int) -> torch.Tensor:
    buf = torch.empty(n, dtype=torch.uint8)
    if n:
        dist.recv(buf, src=src)
    return buf


def read_header(raw: torch.Tensor) -> tuple[int, int, int, int]:
    """``(kind, meta bytes, kv elements, kv element bytes)`` of a received header buffer
    (uint8, at least 40 bytes); ``ConnectionError`` if its magic is wrong or a size is
    negative or past the limits (:data:`MAX_META_BYTES`, :data:`MAX_KV_BYTES` at
    :data:`MAX_ELEMENT_BYTES` a value): the link is out of step, nothing more can be read."""
    magic, kind, meta_bytes, kv_elems, kv_itemsize = \
        raw[:8 * HEADER_FIELDS].view(torch.int64).tolist()
    if magic != MAGIC:
        raise ConnectionError(f"a header starts with {magic:#x}, not the magic {MAGIC:#x}: the "
                              f"link is out of step; nothing more is read from it")
    if kind != DONE and not (0 <= meta_bytes <= MAX_META_BYTES and 0 <= kv_itemsize
                             <= MAX_ELEMENT_BYTES and 0 <= kv_elems
                             and kv_elems * MAX_ELEMENT_BYTES <= MAX_KV_BYTES):
        raise ConnectionError(f"a header declares {meta_bytes} metadata bytes and {kv_elems} "
                              f"K/V values of {kv_itemsize} bytes: out of range (at most "
                              f"{MAX_META_BYTES} and {MAX_KV_BYTES // MAX_ELEMENT_BYTES} of "
                              f"at most {MAX_ELEMENT_BYTES}), so the link is out of step; "
                              f"nothing more is read from it")
    return kind, meta_bytes, kv_elems, kv_itemsize


def recv_loop(src: int, inbox: queue.Queue) -> None:
    """The decode rank's receiving thread: handoffs into ``inbox`` (or :class:`Refused` ones,
    each read to its end so the link stays in step), then ``DONE``, or the exception that
    ended the link (a peer gone, a header out of step: :func:`read_header`). The K/V buffer is
    filled with NaN first: a shorter payload leaves NaN behind."""
    try:
        while True:
            raw = torch.zeros(HEADER_BUFFER_BYTES, dtype=torch.uint8)
            dist.recv(raw, src=src)
            kind, meta_bytes, kv_elems, kv_itemsize = read_header(raw)
            if kind == DONE:
                inbox.put(DONE)
                return
            meta = _recv_bytes(meta_bytes, src).numpy().tobytes()
            if kind != HANDOFF:
                _recv_bytes(kv_elems * MAX_ELEMENT_BYTES, src)    # read as declared: in step
                inbox.put(Refused(f"a message of unknown kind {kind} (expected {HANDOFF} or "
                                  f"{DONE}) was skipped"))
                continue
            inbox.put(_recv_kv(meta, kv_elems, kv_itemsize, src))
    except Exception as err:  # noqa: BLE001 - the prefill rank is gone: reported, not raised
        inbox.put(err)


def read_meta(meta: bytes) -> tuple[KVHandoff, tuple[int, ...], str]:
    """A handoff's metadata message, decoded as UTF-8 JSON and checked field by field
    (:func:`~llminfra.cluster.kv_transfer.handoff_from_meta`); ``ValueError`` if it is not
    JSON or a field is wrong. Never unpickles: the bytes are only ever data."""
    try:
        obj = json.loads(meta.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"handoff metadata is not UTF-8 JSON: {clip(str(err))}") from None
    return handoff_from_meta(obj)


def _request_id_of(meta: bytes) -> str | None:
    """The request id of metadata that failed its checks, where one can still be read."""
    try:
        rid = json.loads(meta.decode("utf-8")).get("request_id")
    except Exception:  # noqa: BLE001 - not JSON, or not an object: no id to name
        return None
    return rid if isinstance(rid, str) and 0 < len(rid) <= 256 else None


def _recv_kv(meta: bytes, kv_elems: int, kv_itemsize: int, src: int) -> KVHandoff | Refused:
    """The K/V message of one handoff, checked against its metadata and header; a refused one
    is read into a buffer as large as the sender can be sending, and dropped."""
    most = kv_elems * MAX_ELEMENT_BYTES
    try:
        h, shape, dtype = read_meta(meta)
    except ValueError as err:
        _recv_bytes(most, src)
        rid = _request_id_of(meta)
        return Refused(f"handoff{'' if rid is None else f' of request {rid!r}'} refused: its "
                       f"metadata cannot be read: {err}", request_id=rid)
    itemsize = KV_DTYPES[dtype].itemsize
    if math.prod(shape) != kv_elems or kv_itemsize != itemsize:
        described = math.prod(shape) * itemsize
        _recv_bytes(max(most, described if described <= MAX_KV_BYTES else 0), src)
        return Refused(f"handoff of request {h.request_id!r} refused: its metadata describes "
                       f"K/V {tuple(shape)} {dtype} ({itemsize}-byte values), its header "
                       f"{kv_elems} values of {kv_itemsize} bytes", h)
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
