"""The glossary's entries, as data: English term, Korean term, one-line definition, the chapter
of first use, which source text the Korean term comes from, and other spellings.

The Korean term is the one the course's source texts use (``shared/sources/000_*.txt``: the
overview of GPU memory, serving and cost; ``004_*.txt``: GPU optimisation for deployment), with
``ko_source`` naming the text, or ``None`` where neither text has the term and the entry gives
the usual Korean rendering. Searched, rendered and linked by :mod:`llminfra.course.glossary`;
shown in chapter 00.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """One glossary entry. ``aliases`` are other spellings matched in the chapters' text."""
    term: str
    ko: str
    definition: str
    chapter: str
    ko_source: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def anchor(self) -> str:
        """The heading slug GitHub and ``docs/glossary.md`` use: ``"KV cache"`` -> ``"kv-cache"``."""
        return slug(self.term)


def slug(text: str) -> str:
    """Lower case, punctuation dropped, spaces to hyphens (GitHub's heading anchors):
    ``"time to first token (TTFT)"`` -> ``"time-to-first-token-ttft"``."""
    text = re.sub(r"[^\w\- ]", "", text.lower(), flags=re.UNICODE)
    return text.strip().replace(" ", "-")


GLOSSARY: tuple[Term, ...] = (
    Term("training", "학습", "Fitting the weights: forward pass, backward pass (gradients) and an "
         "optimizer step; holds weights, gradients, optimizer state and activations.", "00",
         "004", ("train step", "training step")),
    Term("inference", "추론", "Running a trained model to produce outputs; holds the weights, the "
         "KV cache and one layer's transient activations.", "00", "004"),
    Term("weights", "가중치", "The model's learned parameters; their memory is parameters × bytes "
         "per parameter.", "00", "000", ("parameters",)),
    Term("gradients", "그래디언트", "Derivative of the loss with respect to each weight, one per "
         "weight, computed by the backward pass.", "01", "004"),
    Term("optimizer state", "옵티마이저 상태", "What the optimizer keeps per weight between steps "
         "(AdamW: two moments, 8 bytes per parameter in fp32).", "01", "004",
         ("optimizer states",)),
    Term("activations", "활성화", "Intermediate tensors of a forward pass; training keeps them for "
         "the backward pass, inference frees them layer by layer.", "00", "004",
         ("activation",)),
    Term("mixed precision", "혼합 정밀도", "Training with 16-bit weights and activations and an "
         "fp32 master copy of the weights (Micikevicius et al., 2017).", "01", None,
         ("mixed-precision",)),
    Term("activation checkpointing", "활성화 체크포인팅", "Keeping only each block's input during "
         "the forward pass and recomputing the rest during backward: memory for compute.", "01",
         None, ("checkpointing", "checkpointed")),
    Term("ZeRO / FSDP", "ZeRO / FSDP (샤딩 데이터 병렬)", "Data parallelism that shards the "
         "optimizer state, gradients and weights across GPUs instead of copying them "
         "(Rajbhandari et al., 2019; Zhao et al., 2023).", "01", None, ("ZeRO", "FSDP")),
    Term("prefill", "프리필", "The first phase of a request: the whole prompt in one forward pass, "
         "which fills the KV cache and yields the first token; compute-bound.", "00", "000"),
    Term("decode", "디코드", "The second phase: one new token per forward pass per sequence, "
         "reading all weights and the KV cache each step; memory-bound.", "00", "000",
         ("decoding", "decode step")),
    Term("arithmetic intensity", "산술 강도", "FLOPs done per byte moved from memory; below the "
         "ridge point a kernel is limited by memory bandwidth.", "01", None,
         ("FLOP/byte", "FLOPs per byte")),
    Term("ridge point", "리지 포인트", "A processor's peak FLOP/s divided by its memory bandwidth: "
         "the arithmetic intensity needed to be compute-bound (roofline model).", "01", None),
    Term("roofline", "루프라인 (roofline)", "A kernel's attainable FLOP/s: the lesser of peak "
         "FLOP/s and arithmetic intensity × memory bandwidth (Williams et al., 2009).", "03",
         None, ("roofline model",)),
    Term("memory-bound", "메모리 병목 (memory-bound)", "Limited by bytes moved, not by "
         "arithmetic: faster memory helps, more FLOP/s do not.", "01", None,
         ("memory bound",)),
    Term("memory bandwidth", "메모리 대역폭", "Bytes per second between a processor and its "
         "memory (an H100's HBM3: 3.35 TB/s).", "00", "004", ("bandwidth",)),
    Term("KV cache", "KV 캐시", "The keys and values of every earlier token, kept per layer so "
         "that each decode step computes only the new token's.", "01", "000",
         ("KV caches", "key/value cache")),
    Term("paged attention", "페이지드 어텐션", "vLLM's KV cache in fixed-size blocks listed by a "
         "block table, allocated on demand like virtual-memory pages (Kwon et al., 2023).", "01",
         "000", ("PagedAttention",)),
    Term("batch size", "배치 크기", "Sequences processed together in one forward pass; larger "
         "batches reuse each weight read.", "00", "000", ("batch",)),
    Term("throughput", "처리량", "Tokens produced per second over all requests (토큰/초); sets "
         "the cost per token.", "01", "000"),
    Term("FlashAttention", "FlashAttention", "Exact attention computed tile by tile in on-chip "
         "SRAM with an online softmax, never writing the N × N scores to HBM (Dao et al., "
         "2022).", "01", "000"),
    Term("quantization", "양자화", "Storing numbers in fewer bits (int8, int4, fp8) with scales, "
         "to save memory and bandwidth at some loss of accuracy.", "01", "000",
         ("quantized", "quantize")),
    Term("GB / GiB", "GB / GiB", "GB = 10⁹ bytes, GiB = 2³⁰ bytes; they differ by 7.4 %. The course "
         "writes GB for model sizes and bandwidths (GB/s), GiB for memory: a GPU's \"80 GB\" of "
         "HBM is 80 GiB (memory is sized in binary units), of which the driver reports 79.6 GiB.",
         "00", None, ("GiB",)),
    Term("grouped-query attention (GQA)", "MQA·GQA (그룹 쿼리 어텐션)", "Query heads share key/value "
         "heads in groups, dividing the KV cache by heads / KV heads; MQA keeps one KV head.",
         "00", "000", ("GQA", "MQA", "multi-query attention", "grouped-query attention")),
    Term("precision", "정밀도", "The number format a tensor is stored or computed in (fp32, bf16, "
         "fp16, fp8, int8, int4), and so its bytes per value.", "02", "000",
         ("number format", "number formats")),
    Term("post-training quantization (PTQ)", "학습 후 양자화 (PTQ)", "Quantizing a trained model "
         "without retraining it, from its weights and a little calibration data (GPTQ, AWQ).",
         "03", "004", ("post-training quantization", "PTQ")),
    Term("GPTQ", "GPTQ", "Post-training quantization column by column, pushing each column's "
         "rounding error onto the columns not yet quantized (Frantar et al., 2022).", "03",
         "004"),
    Term("AWQ", "AWQ", "Activation-aware weight quantization: scale up the weight columns of "
         "large-activation channels before rounding (Lin et al., 2023).", "03", "004"),
    Term("perplexity", "퍼플렉서티", "exp(mean negative log-likelihood per token) on held-out "
         "text; lower is better, and only comparable on the same text.", "03", None),
    Term("block table", "블록 테이블", "A sequence's list of KV-cache blocks in token order; "
         "token p lives in slot table[p // B] · B + p % B.", "04", None, ("block tables",)),
    Term("fragmentation", "단편화", "Memory reserved but holding no tokens: internal (inside a "
         "reservation) or external (free holes too small to use).", "04", None,
         ("internal fragmentation", "external fragmentation")),
    Term("copy-on-write", "쓰기 시 복사 (copy-on-write)", "Forks share blocks; a block is copied "
         "only when one holder writes into it while others still hold it.", "04", None),
    Term("prefix caching", "prefix caching (같은 앞부분 재사용)", "Reusing the KV blocks of an "
         "identical prompt prefix (a system prompt) across requests.", "04", "000",
         ("prefix cache",)),
    Term("offloading", "오프로딩", "Moving data (weights, KV cache) from GPU memory to CPU memory "
         "or disk and back, trading link bandwidth for capacity.", "04", "004",
         ("offload", "swap")),
    Term("preemption", "선점", "Evicting a running request when memory runs out, to swap it out "
         "or recompute it later.", "04", None, ("preempt", "preempted")),
    Term("time to first token (TTFT)", "첫 토큰까지 걸리는 시간 (TTFT)", "Time from a request's "
         "arrival to its first output token: queueing plus prefill.", "05", "000",
         ("TTFT", "time to first token")),
    Term("time per output token (TPOT)", "출력 토큰당 시간 (TPOT)", "Mean time between a "
         "request's output tokens after the first: the decode speed a user sees.", "05", None,
         ("TPOT", "time per output token", "inter-token latency")),
    Term("latency", "지연 시간", "Time a single request waits for its answer (TTFT, TPOT, "
         "end-to-end); traded against throughput by batching.", "05", "004"),
    Term("inference engine", "추론 엔진", "Server software that keeps the model in memory and "
         "schedules many users' requests onto it (vLLM, TGI, SGLang).", "05", "000",
         ("serving engine",)),
    Term("dynamic batching", "동적 배치", "Collecting requests that arrive within a time window "
         "into one batch, run until all of them finish.", "05", "004"),
    Term("continuous batching", "연속 배칭", "Scheduling at every decode step: finished requests "
         "leave and waiting ones join the running batch at once (Orca, Yu et al., 2022).", "05",
         "000", ("iteration-level scheduling",)),
    Term("chunked prefill", "chunked prefill (긴 프롬프트의 프리필을 잘라서 처리)", "Splitting a "
         "long prompt's prefill into chunks scheduled alongside decode steps.", "05", "000"),
    Term("HBM / SRAM", "HBM (고대역폭 메모리) / SRAM", "A GPU's large off-chip memory (HBM, "
         "TB/s) and its small on-chip memory (SRAM, tens of TB/s).", "06", "000",
         ("HBM", "SRAM")),
    Term("online softmax", "온라인 소프트맥스", "A softmax in one pass: a running max m and a "
         "running sum l, rescaled when the max grows (Milakov & Gimelshein, 2018).", "04",
         None),
    Term("split-KV decoding", "split-KV 디코딩 (Flash-Decoding)", "Decode attention that splits "
         "the cached keys over many thread blocks and merges their partial softmaxes (Flash-"
         "Decoding, FlashInfer).", "06", None, ("Flash-Decoding", "FlashInfer")),
    Term("tensor parallelism", "텐서 병렬", "Splitting every weight matrix across GPUs "
         "(column- then row-parallel), with an all-reduce per split pair (Megatron-LM).", "07",
         "000", ("tensor parallel", "tensor-parallel")),
    Term("pipeline parallelism", "파이프라인 병렬", "Splitting the layers into stages on "
         "different GPUs and streaming micro-batches through them.", "07", "000",
         ("pipeline parallel",)),
    Term("data parallelism", "데이터 병렬", "Whole copies of the model on several GPUs, each "
         "serving (or training on) its share of the requests.", "01", "000",
         ("data parallel", "data-parallel")),
    Term("model parallelism", "모델 병렬화", "Splitting one model across GPUs (tensor or "
         "pipeline parallelism) because it does not fit on one.", "07", "004"),
    Term("all-reduce", "올리듀스 (all-reduce)", "A collective that sums a tensor across GPUs and "
         "leaves the sum on every GPU; a ring sends 2(n−1)/n of the bytes per GPU.", "07", None,
         ("all-reduces",)),
    Term("interconnect", "인터커넥트", "The link between GPUs: NVLink inside a server, PCIe, "
         "InfiniBand between servers.", "04", "000", ("NVLink", "PCIe")),
    Term("micro-batch", "마이크로 배치", "A slice of a batch that moves through the pipeline "
         "stages on its own, so that stages work at the same time.", "07", "004",
         ("micro-batches",)),
    Term("pipeline bubble", "파이프라인 버블", "The idle share of a pipeline's time, "
         "(p − 1)/(m + p − 1) for p stages and m micro-batches (GPipe).", "07", None,
         ("bubble",)),
    Term("utilization", "활용률", "The share of time (or of peak FLOP/s) a GPU does useful work.",
         "08", "004", ("GPU utilization", "utilisation", "GPU utilisation")),
    Term("cost per token", "토큰당 비용", "GPU cost per hour divided by tokens produced per hour "
         "when self-hosting.", "05", "000", ("cost per million tokens",)),
    Term("mixture of experts", "전문가 혼합 (MoE)", "A layer of many MLPs (experts) of which a "
         "router picks the top k for each token: all are stored, k run.", "11", None,
         ("mixture-of-experts",)),
    Term("expert parallelism", "전문가 병렬", "Each GPU holds some of a mixture-of-experts "
         "layer's experts; tokens travel to their experts and back by two all-to-alls.", "11",
         None, ("expert parallel", "expert-parallel")),
    Term("all-to-all", "올투올 (all-to-all)", "A collective in which every GPU sends a "
         "different slice to every other GPU (expert parallelism's dispatch and combine).",
         "11", None),
    Term("context parallelism", "컨텍스트 병렬", "Splitting one long sequence's tokens (and its "
         "KV cache) over GPUs; partial attention results merge by the online softmax.", "11",
         None, ("context parallel", "context-parallel")),
    Term("ring attention", "링 어텐션", "Context parallelism in which the K/V blocks travel "
         "round a ring of GPUs while each computes attention for its own queries.", "11", None),
    Term("prefill/decode disaggregation", "프리필·디코드 분리 실행", "Running prefill and "
         "decode on different GPUs (or engines) and moving each request's KV cache between "
         "them.", "11", "000", ("disaggregation", "disaggregated")),
    Term("goodput", "굿풋 (목표 지연을 지킨 처리량)", "Requests per second that meet both a TTFT "
         "and a TPOT target (DistServe's measure of a serving system).", "11", None),
)
