"""The checkable statements of source text 004 ("GPU optimization strategies for LLM
deployment"), in its order.

Each :class:`~llminfra.ledger.claim.Claim` paraphrases the statement in the course's words; the
text's own words (Korean) and the heading they stand under are in :mod:`llminfra.ledger.quotes`.
Section names are the text's headings, translated (the GPU comparison table stands under the
one on inference services). GPU facts come from the catalog (:mod:`llminfra.specs.gpus`, each
row with its datasheet source).
"""

from __future__ import annotations

from llminfra.ledger import checks as c
from llminfra.ledger.claim import Claim, Finding, ratio_verdict
from llminfra.specs import get_gpu, gpu_names
from llminfra.calc import memory as mem
from llminfra.calc.communication import get_interconnect, pcie_claim_table

SIZE = "Model size and VRAM demand"
BANDWIDTH = "Memory bandwidth: the key to the bottleneck"
NVIDIA = "NVIDIA GPUs: the Hopper, Ampere and Ada Lovelace architectures"
AMD = "AMD Instinct GPUs: the rise of CDNA"
TRAINING = "Training (pre-training and fine-tuning)"
INFERENCE = "Optimising LLM inference services"
QUANTIZATION = "Quantization: shrinking the model"
PARALLELISM = "Model and pipeline parallelism"
BATCHING = "Offloading and dynamic / continuous batching"
CLOUD = "Cloud vs on-premises: a strategic choice"
POWER = "Power efficiency, cooling and network bandwidth"
OUTLOOK = "Outlook: running LLMs on GPUs, now and next"

CATALOG = "GPU catalog (llminfra.specs.gpus, datasheet sources per row)"
H100_PAGE = "NVIDIA H100 product page / Hopper whitepaper ('up to 4X faster training … GPT-3 175B')"


def _bw(gpu: str) -> float:
    return get_gpu(gpu).hbm_bytes_per_s


def _tf(gpu: str, dtype: str = "bf16", sparse: bool = False) -> float:
    return get_gpu(gpu).tflops(dtype, sparse)


def _capacity_vs_speed() -> Finding:
    """H200 vs H100: capacity, bandwidth and compute ratios."""
    cap = get_gpu("h200").memory_bytes / get_gpu("h100").memory_bytes
    bw, tf = _bw("h200") / _bw("h100"), _tf("h200") / _tf("h100")
    return Finding(f"H200 / H100: memory {cap:.3g}×, bandwidth {bw:.3g}×, bf16 compute {tf:.3g}×",
                   cap > bw > tf == 1.0)


def _h100_vs_a100_inference() -> Finding:
    bw40, bw80 = _bw("h100") / _bw("a100-40gb"), _bw("h100") / _bw("a100-80gb")
    tf = _tf("h100") / _tf("a100-80gb")
    return Finding(f"H100 SXM / A100: bandwidth {bw80:.3g}× (80GB) or {bw40:.3g}× (40GB); dense "
                   f"bf16 {tf:.3g}×", max(bw40, bw80) < 4 and tf < 4)


def _hopper_training() -> Finding:
    dense = _tf("h100") / _tf("a100-80gb")
    fp8 = _tf("h100", "fp8") / _tf("a100-80gb")
    return Finding(f"H100 / A100 dense: bf16 {dense:.3g}×, H100 fp8 vs A100 bf16 {fp8:.3g}×",
                   dense < 4 < fp8)


def _fp8_only_hopper() -> Finding:
    h, a = get_gpu("h100").tflops("fp8"), get_gpu("a100-80gb").tflops("fp8")
    return Finding(f"fp8 peak: H100 {h}, A100 {a}", h is not None and a is None)


def _l40s_launch() -> Finding:
    g = get_gpu("l40s")
    return Finding(f"l40s launch: {g.launch}", "2023" in g.launch)


def _mi300x_vs_h100() -> Finding:
    bw, tf = _bw("mi300x") / _bw("h100"), _tf("mi300x") / _tf("h100")
    return Finding(f"MI300X / H100 SXM: bandwidth {bw:.3g}×, dense bf16 {tf:.3g}×", 1.5 < bw < 1.7 and tf < 1.4)


def _largest_at_launch() -> Finding:
    mi = get_gpu("mi300x").memory_bytes
    bigger = [n for n in gpu_names() if get_gpu(n).memory_bytes > mi]
    return Finding(f"cards in the catalog with more memory than MI300X: {', '.join(bigger) or 'none'}",
                   bool(bigger))


def _a100_80_bandwidth() -> Finding:
    return Finding(f"A100 80GB SXM {_bw('a100-80gb') / 1e12:.4g} TB/s, A100 40GB "
                   f"{_bw('a100-40gb') / 1e12:.4g} TB/s (the table's 1.555)",
                   ratio_verdict(1.555e12, _bw("a100-40gb")) == "holds"
                   and ratio_verdict(1.555e12, _bw("a100-80gb")) == "wrong")


def _sparse_column() -> Finding:
    rows = {"a100-80gb": 624, "h100": 989, "l40s": 733}
    kinds = {g: ("sparse" if abs(v - _tf(g, "bf16", True)) < 2 else
                 "dense" if abs(v - _tf(g)) < 2 else "neither") for g, v in rows.items()}
    return Finding("the column's figures are: " + ", ".join(f"{g} {rows[g]} = {k}" for g, k in kinds.items()),
                   kinds == {"a100-80gb": "sparse", "h100": "dense", "l40s": "sparse"})


def _h200_compute() -> Finding:
    return Finding(f"dense bf16: H200 {_tf('h200')}, H100 {_tf('h100')}", _tf("h200") == _tf("h100"))


def _mi300x_tflops() -> Finding:
    v = _tf("mi300x")
    return Finding(f"MI300X dense fp16/bf16 {v} TFLOPS = {v / _tf('h100'):.3g}× H100; the "
                   f"table's ~1,285 is {(1285 - v) / v:+.1%} off",
                   ratio_verdict(1285, v) == "approximately")


def _seven_b_sizes() -> Finding:
    sizes = {d: mem.weight_bytes("llama-2-7b", d) / 1e9 for d in ("fp32", "fp16", "int8", "int4")}
    stated = {"fp32": 28, "fp16": 14, "int8": 7, "int4": 3.5}
    verdicts = {d: ratio_verdict(stated[d], sizes[d]) for d in sizes}
    return Finding("llama-2-7b: " + ", ".join(f"{d} {v:.3g} GB" for d, v in sizes.items()),
                   set(verdicts.values()) == {"approximately"})


def _pcie_share() -> Finding:
    rows = pcie_claim_table()
    hits = [r for r in rows if r["in_40_50"] or r["at_least_40"]]
    pre = [r for r in hits if r["phase"] == "prefill"]
    dec = [r for r in rows if r["phase"] == "decode" and r["interconnect"].startswith("pcie")]
    return Finding(f"Llama-2-70B on A100s: {len(pre)} prefill cases reach ≥ 40 % over PCIe; decode "
                   f"shares (no link latency) {min(r['share'] for r in dec):.1%}–"
                   f"{max(r['share'] for r in dec):.1%}", bool(pre))


def _pcie_vs_hbm() -> Finding:
    link = get_interconnect("pcie-gen5").bytes_per_s
    return Finding(f"PCIe Gen5 x16 {link / 1e9:.3g} GB/s per direction = {link / _bw('h100'):.2%} of "
                   f"H100's HBM bandwidth", link / _bw("h100") < 0.05)


CLAIMS: list[Claim] = [
    Claim("004-01", SIZE, "LLM performance is directly proportional to VRAM capacity.",
          "what limits decode: bandwidth vs capacity", "misleading",
          "Capacity decides what fits (model, KV cache, batch); decode speed follows bandwidth. "
          "H200 has 1.76× H100's memory but 1.43× its bandwidth and the same compute.", ("08",),
          CATALOG, _capacity_vs_speed),
    Claim("004-02", SIZE, "A 70B model needs about 140 GB in fp16.", "Llama-2-70B's parameter count",
          "approximately", "68.98 B × 2 B = 137.95 GB (128.5 GiB): 1.5 % high.", ("02",),
          "llminfra.calc.memory.weight_bytes",
          lambda: c.stated_size("llama-2-70b", "fp16", 140, "approximately")),
    Claim("004-03", SIZE, "Training a 10B model in fp16 may need 80–100 GB in total.",
          "bytes per parameter of the optimizer recipe, activations", "misleading",
          "Mixed-precision AdamW needs 16 B per parameter, 160 GB before activations; 80–100 GB "
          "matches momentum-free SGD or 8-bit optimizers, which the text does not say.", ("01",),
          "Rajbhandari et al. 2020 (ZeRO), §3.1; llminfra.calc.memory.TRAINING_RECIPES", c.training_10b),
    Claim("004-04", SIZE, "The KV cache grows exponentially with context length and concurrent requests.",
          "the KV-cache size formula", "wrong",
          "It grows linearly in each: 2 · layers · KV heads · head_dim · bytes per token, times "
          "tokens, times sequences.", ("02", "04"), "llminfra.calc.memory.kv_bytes", c.kv_linear_growth),
    Claim("004-05", BANDWIDTH, "Token generation is memory-bound: limited by how fast weights are read.",
          "decode arithmetic intensity", "holds",
          "About 1 FLOP per byte at batch 1 against ridge points of 150–300 FLOP/B.", ("01", "08"),
          "llminfra.calc.step.decode_arithmetic_intensity", c.decode_memory_bound),
    Claim("004-06", BANDWIDTH, "H100 provides 3.35 TB/s of HBM3 bandwidth.", "H100 variant", "holds",
          "True of the SXM5 card; the PCIe card has 2.0 TB/s of HBM2e.", ("08",), CATALOG,
          lambda: c.gpu_field("h100", "hbm_bytes_per_s", 3.35e12, "holds", " B/s")),
    Claim("004-07", BANDWIDTH, "Thanks to that bandwidth, H100 reaches up to 4× faster inference than A100.",
          "bandwidth and compute ratios; NVIDIA's conditions", "misleading",
          "Bandwidth alone predicts 1.64× over an A100-80GB (2.15× over the 40GB); dense bf16 "
          "3.2×. Vendor 'up to' factors come from FP8, large models and multi-GPU systems, not "
          "bandwidth.", ("08",), f"{CATALOG}; {H100_PAGE}", _h100_vs_a100_inference),
    Claim("004-08", NVIDIA, "Hopper (H100, H200) came out in 2022.", "launch dates", "holds",
          "H100 was announced in March 2022 and shipped from late 2022; H200 followed in 2023–24.",
          ("08",), CATALOG, lambda: c.gpu_field("h100", "launch", "2022", "holds")),
    Claim("004-09", NVIDIA, "Hopper's 4th-generation Tensor Cores support FP8 natively.", "datasheets",
          "holds", "H100 lists FP8 peaks; A100 has none.", ("03", "08"), CATALOG, _fp8_only_hopper),
    Claim("004-10", NVIDIA, "Hopper improved LLM training performance more than 4× over the previous generation.",
          "compute ratios; NVIDIA's 'up to 4X' conditions", "misleading",
          "A vendor 'up to' for GPT-3 175B with FP8 on large clusters. Dense bf16 peaks differ by "
          "3.2×; only FP8 (6.3× A100's bf16) exceeds 4×, at lower precision.", ("08",),
          f"{CATALOG}; {H100_PAGE}", _hopper_training),
    Claim("004-11", NVIDIA, "H100 has 80 GB of HBM3 and 3.35 TB/s.", "H100 variant", "holds",
          "H100 SXM5: 80 GB HBM3, 3.35 TB/s.", ("08",), CATALOG,
          lambda: c.gpu_field("h100", "memory_type", "HBM3", "holds")),
    Claim("004-12", NVIDIA, "H200 has 141 GB of HBM3e.", "datasheet", "holds",
          "141 GB HBM3e at 4.8 TB/s.", ("08",), CATALOG,
          lambda: c.gpu_field("h200", "memory_type", "HBM3e", "holds")),
    Claim("004-13", NVIDIA, "NVLink gives up to 900 GB/s between GPUs.", "NVLink 4 figures", "holds",
          "900 GB/s is the total over 18 links, both directions (450 GB/s each way).", ("07", "08"),
          CATALOG, lambda: c.gpu_field("h100", "interconnect", "900 GB/s", "holds")),
    Claim("004-14", NVIDIA, "Ampere (A100) came out in 2020.", "launch dates", "holds",
          "A100 was announced at GTC in May 2020.", ("08",), CATALOG,
          lambda: c.gpu_field("a100-40gb", "launch", "2020", "holds")),
    Claim("004-15", NVIDIA, "A100 comes in 40 GB and 80 GB HBM2e versions.", "memory type per variant",
          "wrong", "The 40 GB A100 uses HBM2 (1.555 TB/s); only the 80 GB card has HBM2e "
          "(2.039 TB/s on SXM).", ("08",), CATALOG,
          lambda: c.gpu_field("a100-40gb", "memory_type", "HBM2e", "wrong")),
    Claim("004-16", NVIDIA, "A100's 3rd-generation Tensor Cores added TF32, FP16, BF16, INT8 and INT4.",
          "A100 datasheet", "holds", "The A100 datasheet lists TF32, BF16, FP16, INT8 and INT4 "
          "tensor throughput.", ("03", "08"), "NVIDIA A100 datasheet; GPU catalog",
          lambda: Finding(f"a100-80gb tf32 peak {get_gpu('a100-80gb').tflops('tf32')} TFLOPS",
                          get_gpu("a100-80gb").tflops("tf32") is not None)),
    Claim("004-17", NVIDIA, "L40S launched in October 2022.", "launch dates", "wrong",
          "October 2022 is the L40; the L40S was announced in August 2023 (SIGGRAPH).", ("08",),
          CATALOG, _l40s_launch),
    Claim("004-18", NVIDIA, "L40S is an AD102-based card with 48 GB of GDDR6.", "datasheet", "holds",
          "AD102, 48 GB GDDR6 with ECC.", ("08",), CATALOG,
          lambda: c.gpu_field("l40s", "memory_type", "GDDR6", "holds")),
    Claim("004-19", NVIDIA, "L40S gives more than 5× the generative-AI inference performance of the "
          "previous generation.", "the previous-generation card and NVIDIA's conditions",
          "not checkable", "A vendor figure whose workload and settings the text does not give; "
          "the previous generation is the Ampere A40, which the catalog does not hold, so no "
          "ratio is computed here.", ("08",),
          "NVIDIA L40S product page"),
    Claim("004-20", NVIDIA, "L40S has 864 GB/s of memory bandwidth.", "datasheet", "holds",
          "864 GB/s of GDDR6.", ("08",), CATALOG,
          lambda: c.gpu_field("l40s", "hbm_bytes_per_s", 864e9, "holds", " B/s")),
    Claim("004-21", AMD, "MI300X launched in December 2023.", "launch dates", "holds",
          "AMD launched it on 6 December 2023.", ("08",), CATALOG,
          lambda: c.gpu_field("mi300x", "launch", "2023-12", "holds")),
    Claim("004-22", AMD, "The card is called 'Radeon Instinct MI300X'.", "AMD's product naming",
          "wrong", "Its name is AMD Instinct MI300X; the 'Radeon Instinct' brand ended with the "
          "MI50 / MI60 generation.", ("08",), CATALOG,
          lambda: c.gpu_field("mi300x", "display_name", "AMD Instinct MI300X", "holds")),
    Claim("004-23", AMD, "MI300X is built on a 5 nm process (the 'Aqua Vanjaram' chip).", "die process",
          "approximately", "The compute dies (XCDs) are TSMC N5 but the I/O dies are N6.", ("08",),
          CATALOG, lambda: c.gpu_field("mi300x", "arch", "N5", "holds")),
    Claim("004-24", AMD, "MI300X's 192 GB of HBM3 is the most of any AI accelerator.",
          "the catalog's capacities", "approximately",
          "True at its launch (H200: 141 GB); the MI325X (256 GB) has since passed it.", ("08",),
          CATALOG, _largest_at_launch),
    Claim("004-25", AMD, "MI300X has 5.3 TB/s of memory bandwidth.", "datasheet", "holds",
          "5.3 TB/s over 8 HBM3 stacks.", ("08",), CATALOG,
          lambda: c.gpu_field("mi300x", "hbm_bytes_per_s", 5.3e12, "holds", " B/s")),
    Claim("004-26", AMD, "MI300X is up to 60 % faster than H100 for inference and training of very "
          "large models such as BLOOM-176B.", "bandwidth and compute ratios; AMD's conditions",
          "misleading", "AMD's figure is for inference; the bandwidth ratio (1.58×) supports it "
          "for memory-bound decode, but dense compute is only 1.32× H100's, so training gains "
          "cannot reach 60 % from the hardware alone.", ("08",), f"{CATALOG}; AMD 'Advancing AI' (Dec 2023)",
          _mi300x_vs_h100),
    Claim("004-27", TRAINING, "Training a 175B model needs dozens of GPUs and hundreds of GB of VRAM.",
          "bytes per parameter of mixed-precision AdamW", "misleading",
          "Weights, gradients, fp32 master and Adam moments alone are 2.8 TB, thousands of GB "
          "before activations: some 33–35 cards of 80 GB just to hold them.", ("01",),
          "ZeRO §3.1; llminfra.calc.memory.TRAINING_RECIPES", c.training_175b),
    Claim("004-28", INFERENCE, "Table: A100 80GB has 1.555 TB/s.", "A100 variant", "wrong",
          "1.555 TB/s is the A100 40GB; the A100 80GB SXM has 2.039 TB/s (PCIe: 1.935).", ("08",),
          CATALOG, _a100_80_bandwidth),
    Claim("004-29", INFERENCE, "Table: peak FP16 tensor TFLOPS of 624 (A100), 989 (H100), 733 (L40S).",
          "dense vs 2:4-sparse peaks", "misleading",
          "The column mixes kinds: A100's 624 and L40S's 733 are sparse peaks, H100's 989 is "
          "dense. Dense: A100 312, H100 989, L40S 362.", ("08",), CATALOG, _sparse_column),
    Claim("004-30", INFERENCE, "Table: H200's FP16 compute is 'H100+'.", "H200 datasheet", "misleading",
          "H200 has exactly H100's compute (989 dense); only memory (141 GB, 4.8 TB/s) grew.",
          ("08",), CATALOG, _h200_compute),
    Claim("004-31", INFERENCE, "Table: MI300X has ~1,285 FP16 TFLOPS, 1.3× H100.", "datasheet", "approximately",
          "The datasheet gives 1,307 dense (1.32× H100); ~1,285 is 1.7 % low.", ("08",), CATALOG,
          _mi300x_tflops),
    Claim("004-32", QUANTIZATION, "A 7B model's weights: 28 GB in fp32, 14 GB in fp16, 7 GB in int8, 3.5 GB in int4.",
          "Llama-2-7B's parameter count, group scales", "approximately",
          "6.74 B parameters give 27.0 / 13.5 / 7.0 / 3.9 GB (int8 and int4 with group scales and "
          "bf16 embeddings).", ("03",), "llminfra.calc.memory.weight_bytes", _seven_b_sizes),
    Claim("004-33", QUANTIZATION, "GPTQ stands for 'General-purpose Quantization'.", "the GPTQ paper", "wrong",
          "The name comes from GPT + quantization ('GPTQ: Accurate Post-Training Quantization for "
          "Generative Pre-trained Transformers'); it builds on Optimal Brain Quantization.", ("03",),
          "Frantar et al. 2022, arXiv:2210.17323"),
    Claim("004-34", QUANTIZATION, "GPTQ compresses large transformers to 3–4 bits with little accuracy loss.",
          "the GPTQ paper; chapter 03's measurement", "holds",
          "The paper's claim for 175B-class models at 3 and 4 bits; chapter 03 runs GPTQ at 4 "
          "bits only: on the tiny model int4 GPTQ (groups of 128) cuts round-to-nearest's layer "
          "error from 4.5 % to 1.9 %, at a perplexity of 4.11 against 4.12 (fp32: 4.11).",
          ("03",),
          "Frantar et al. 2022, abstract; chapter 03"),
    Claim("004-35", PARALLELISM, "Pipeline parallelism idles some GPUs; micro-batches shrink the idle time.",
          "the GPipe bubble", "holds", "(p − 1) / (m + p − 1): 75 % at 4 stages and one batch, "
          "16 % with 16 micro-batches.", ("07",), "GPipe, arXiv:1811.06965", c.pipeline_bubble),
    Claim("004-36", BATCHING, "Offloading the KV cache to CPU memory resumes inference without recomputation.",
          "swap vs recompute", "holds", "Swapped blocks come back byte for byte; chapter 04 "
          "shows swap and recompute side by side and the bytes each moves.", ("04",),
          "Kwon et al. 2023, §4.5; llminfra.kvcache.offload"),
    Claim("004-37", BATCHING, "Dynamic batching runs a batch when a time window closes or a size limit is "
          "hit; continuous batching changes the batch at every decoding iteration.",
          "scheduling policies", "holds", "The definitions match Orca's iteration-level "
          "scheduling (Yu et al., OSDI 2022) and chapter 05's three policies.", ("05",),
          "Yu et al. 2022 (Orca); chapter 05"),
    Claim("004-38", POWER, "GPUs use about 40 % of an AI data centre's power.", "data-centre power "
          "breakdowns", "not checkable", "No source or data centre is named; shares vary by "
          "design and cooling. Datasheets give the same order for one case: a facility full of "
          "DGX H100 at full load, at the 2023 average PUE of 1.58, spends about 35 % on GPUs.",
          ("09",), "none given by the text; chapter 09 (NVIDIA DGX H100 datasheet, Uptime "
          "Institute 2023 survey)"),
    Claim("004-39", POWER, "Dense GPU racks need up to 10× more power per rack.", "rack power figures",
          "not checkable", "No baseline rack or source is given.", ("09",), "none given by the text"),
    Claim("004-40", POWER, "Without proper cooling, GPU performance can fall by up to 30 %.",
          "thermal throttling measurements", "not checkable", "No source or conditions are given; "
          "throttling depends on card, clocks and workload.", ("09",), "none given by the text"),
    Claim("004-41", POWER, "PCIe bandwidth is a small fraction of on-card memory bandwidth.",
          "PCIe and HBM figures", "holds", "PCIe Gen5 x16 moves 64 GB/s each way: under 2 % of "
          "H100's 3.35 TB/s.", ("07", "08"), "PCI-SIG; GPU catalog", _pcie_vs_hbm),
    Claim("004-42", POWER, "On PCIe multi-GPU set-ups, communication can take 40–50 % of inference time.",
          "phase, link, GPU count, latency", "approximately",
          "The communication model reaches it for prefill with tensor parallelism over PCIe; "
          "in decode it holds only if each all-reduce pays tens of µs of latency.", ("07",),
          "llminfra.calc.communication.pcie_claim_table", _pcie_share),
    Claim("004-43", OUTLOOK, "CXL adds memory capacity but does not solve bandwidth.", "CXL link bandwidth",
          "holds", "CXL rides on PCIe lanes (64 GB/s each way at Gen5 x16), 50× below HBM3: "
          "capacity without bandwidth.", ("08",), "CXL 2.0 / 3.0 specifications; PCI-SIG", _pcie_vs_hbm),
    Claim("004-44", SIZE, "A 70B model in fp16 cannot be loaded on one 40 GB or 80 GB GPU.",
          "weights vs capacity", "holds", "137.95 GB of weights exceed any 80 GiB card before the "
          "KV cache is counted.", ("02", "07"), "llminfra.calc.memory.weight_bytes; GPU catalog",
          c.too_big_for_one_gpu),
    Claim("004-45", NVIDIA, "H200's 141 GB makes it better for long-context inference.",
          "KV capacity beside the weights", "holds",
          "Beside Llama-3-70B's bf16 weights, two H200s hold many times more full 8,192-token "
          "sequences than two H100s.", ("08",), "llminfra.calc.memory.max_batch", c.long_context_capacity),
    Claim("004-46", TRAINING, "Data parallelism copies the weights to every GPU and splits the input; "
          "model parallelism splits the model itself.", "definitions", "holds",
          "As in chapter 07: replicas vs tensor / pipeline shards.", ("07",), "chapter 07"),
    Claim("004-47", QUANTIZATION, "Lower precision (int8, int4, int2) shrinks the model.", "bytes per parameter",
          "holds", "Each halving of the bits roughly halves the weights; chapter 03 measures the "
          "quality cost, steep at 2 bits.", ("03",), "llminfra.calc.memory.weight_bytes; chapter 03",
          lambda: c.quantized_rule("llama-2-70b", "int4", 0.5)),
    Claim("004-48", QUANTIZATION, "AWQ quantizes weights using what the activations look like.", "the AWQ paper",
          "holds", "AWQ scales salient input channels by activation magnitude before rounding "
          "(chapter 03 runs it on an outlier layer).", ("03",), "Lin et al. 2023, arXiv:2306.00978"),
    Claim("004-49", PARALLELISM, "Pipeline stages each hold a part of the layers, cutting each GPU's memory.",
          "layer split", "holds", "With p stages each GPU holds about 1/p of the layers.", ("07",),
          "llminfra.parallel.pipeline.split_layers", c.pipeline_memory),
    Claim("004-50", BATCHING, "Continuous batching is supported by vLLM and SGLang.", "their documentation",
          "holds", "Both engines schedule at iteration level.", ("05",),
          "vLLM and SGLang documentation"),
    Claim("004-51", CLOUD, "AWS, Google Cloud and Azure offer H100 and A100 instances.",
          "the clouds' instance catalogues", "holds",
          "E.g. AWS P5 / P4d, Google Cloud A3 / A2, Azure ND H100 v5 / ND A100 v4.", ("09",),
          "the providers' instance-type documentation"),
    Claim("004-52", CLOUD, "Cloud GPUs need little up-front money and scale up and down; on-premises "
          "gives data sovereignty, control and can be cheaper in the long run.",
          "utilisation over the hardware's life", "holds",
          "Hedged as 'can be', and so true; the condition matters: at chapter 09's dated example "
          "prices owning beats renting over 36 months only when the GPUs are busy more than "
          "57.4 % of the hours (44.7 % at the 199,000 USD low price).", ("09",),
          "chapter 09 (llminfra.calc.cost)"),
    Claim("004-53", OUTLOOK, "Power efficiency, cooling and fast networks bear directly on long-term "
          "operating cost.", "power × PUE against the purchase", "approximately",
          "Power is a running cost that never stops, but at chapter 09's example prices power "
          "with cooling is about a sixth of an owned server's monthly cost: the purchase, not the "
          "power bill, dominates.", ("09",),
          "chapter 09 (llminfra.calc.cost.own_server_monthly_cost)"),
]
