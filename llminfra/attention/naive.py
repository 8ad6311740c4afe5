"""Standard attention: form the whole T x S score matrix, softmax it, multiply by V.

This is "Algorithm 0: Standard Attention Implementation" of Dao et al. 2022 (FlashAttention,
arXiv:2205.14135, section 2.2): S = Q Kᵀ and P = softmax(S) are both written to slow memory
(HBM on a GPU, DRAM on a CPU), so memory grows as T·S and the bytes moved as Θ(Nd + N²)
(Theorem 2). Chapter 06 measures both and then removes them with :mod:`.flash`.
"""

from __future__ import annotations

import torch

from llminfra.attention.shapes import (causal_keep, check_attention_call, check_qkv,
                                       compute_dtype, default_scale, group_queries)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    *, softmax_scale: float | None = None, io=None) -> torch.Tensor:
    """softmax(Q Kᵀ · scale + mask) V with the score matrix materialised.

    Equation 1 of Vaswani et al. 2017 (arXiv:1706.03762), computed as Algorithm 0 of Dao et al.
    2022 (arXiv:2205.14135): ``S = Q Kᵀ`` (written out), ``P = softmax(S)`` (written out),
    ``O = P V``. The softmax is the safe one: ``exp(S - rowmax(S)) / rowsum``.

    Shapes: q ``(B, H, T, d)``, k and v ``(B, H_kv, S, d)`` with ``H_kv | H`` (grouped-query /
    multi-query attention); returns ``(B, H, T, d)`` in q's dtype (16-bit inputs are computed in
    float32). ``scale`` defaults to ``1/sqrt(d)``.

    ``causal``: the T queries are the LAST T of the S positions (decoding with a KV cache):
    query i may see keys ``j <= S - T + i``. A query that sees no key at all (T > S) gets a zero
    output row. ``causal`` must be a bool. Forward only: inputs that require grad are refused
    while autograd records (:func:`~llminfra.attention.shapes.check_attention_call`).

    ``io``: an optional :class:`llminfra.attention.io_accounting.IOCounter`; each read from and
    write to slow memory of Algorithm 0 is reported to it (chapter 06, IO accounting).

    Worked example: q = k = v = [[1, 0], [0, 1]] (one head, d = 2, scale = 1/√2), causal:
    row 0 sees only key 0 → [1, 0]; row 1 gives weights softmax([0, 0.7071]) = [0.3302, 0.6698]
    → [0.3302, 0.6698].
    """
    B, H, H_kv, T, S, d = check_qkv(q, k, v)
    causal = check_attention_call("naive_attention", causal, q, k, v)
    work = compute_dtype(q.dtype)
    scale = default_scale(d, softmax_scale)
    Q = group_queries(q, H_kv).to(work)           # (B, H_kv, G, T, d)
    K = k.to(work).unsqueeze(2)                   # (B, H_kv, 1, S, d)
    V = v.to(work).unsqueeze(2)                   # (B, H_kv, 1, S, d)
    if io is not None:
        io.load(q, k)
    S_ = torch.matmul(Q, K.transpose(-2, -1)).mul_(scale)  # (B, H_kv, G, T, S)
    if io is not None:
        io.store(S_)
    if causal:
        S_.masked_fill_(~causal_keep(T, S, device=q.device), float("-inf"))
        if io is not None:
            io.load(S_)
            io.store(S_)
    if io is not None:
        io.load(S_)
    m = S_.amax(dim=-1, keepdim=True)             # (B, H_kv, G, T, 1) row maxima
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)  # fully masked rows: -inf -> 0
    P = torch.exp(S_ - m)                         # (B, H_kv, G, T, S)
    del S_
    l = P.sum(dim=-1, keepdim=True)               # (B, H_kv, G, T, 1) row sums
    P.div_(torch.where(l == 0, torch.ones_like(l), l))
    if io is not None:
        io.store(P)
        io.load(P, v)
    O = torch.matmul(P, V)                        # (B, H_kv, G, T, d)
    if io is not None:
        io.store(O)
    return O.reshape(B, H, T, d).to(q.dtype)
