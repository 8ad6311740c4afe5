"""A stand-in with the engine's API, for the server tests before the real engine exists."""
from dataclasses import dataclass, field
import time


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: list | None = None

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError("max_tokens")


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Metrics:
    ttft_s: float = 0.001
    tpot_s: float = 0.001
    e2e_s: float = 0.01


@dataclass
class RequestOutput:
    request_id: str
    prompt: object
    prompt_token_ids: list
    outputs: list
    finished: bool
    metrics: Metrics = field(default_factory=Metrics)


class _Cfg:
    max_seq_len = 256


class _Model:
    config = _Cfg()


class FakeEngine:
    model = _Model()

    def __init__(self, num_blocks=64, block_size=16, step_s=0.002):
        self.reqs, self.num_blocks, self.block_size, self.step_s = {}, num_blocks, block_size, step_s
        self.n = 0
        self.gen = 0

    def add_request(self, prompt, params, request_id=None, arrival_time=None):
        if len(prompt) + params.max_tokens > 256:
            raise ValueError("prompt too long")
        self.n += 1
        rid = request_id or str(self.n)
        self.reqs[rid] = (list(prompt), params, [CompletionOutput(i) for i in range(params.n)])
        return rid

    def _blocks(self):
        return sum(-(-(len(p) + len(o[0].token_ids)) // self.block_size) for p, _, o in self.reqs.values())

    def step(self):
        time.sleep(self.step_s)
        outs = []
        for rid in list(self.reqs):
            p, params, cos = self.reqs[rid]
            for c in cos:
                t = 97 + (len(c.token_ids) + c.index) % 26
                c.token_ids.append(t)
                c.text += chr(t)
                self.gen += 1
                if len(c.token_ids) >= params.max_tokens:
                    c.finish_reason = "length"
            fin = all(c.finish_reason for c in cos)
            outs.append(RequestOutput(rid, None, p, [CompletionOutput(c.index, c.text, list(c.token_ids), c.finish_reason) for c in cos], fin))
            if fin:
                del self.reqs[rid]
        return outs

    def abort_request(self, rid):
        self.reqs.pop(rid, None)

    def has_unfinished_requests(self):
        return bool(self.reqs)

    def stats(self):
        return {"num_running": len(self.reqs), "num_waiting": 0, "num_swapped": 0,
                "kv_blocks_used": self._blocks(), "kv_blocks_total": self.num_blocks,
                "num_preemptions": 0, "generation_tokens_total": self.gen, "prompt_tokens_total": 0}
