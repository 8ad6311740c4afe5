"""Shared test fixtures."""

import warnings

import pytest
import torch


@pytest.fixture
def gen():
    """A fresh, randomly seeded generator; its seed is printed, and pytest shows it with the
    captured output of a failing test, so the failure can be replayed."""
    g = torch.Generator()
    print(f"torch.Generator seed: {g.seed()}")
    return g


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny matrices: two OpenMP threads stall each other on
    a shared 2-core CPU. Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2():
    """The real model and its tokenizer, loaded by the package (``load_pretrained``)."""
    from llminfra.model import load_pretrained
    torch.manual_seed(0)
    return load_pretrained("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_hf():
    """transformers' model and tokenizer, loaded by its own GGUF code from the same file (about
    30 s: its reader parses the file's metadata once per object). Session-wide: the files that use
    it share one worker (``SHARED_WORKER`` in the root conftest.py)."""
    transformers = pytest.importorskip("transformers")  # a test extra: `make test` installs it
    from llminfra.bench.real import load_hf_model
    from llminfra.model import pretrained_path
    path = pretrained_path("smollm2-135m")
    model = load_hf_model(transformers, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tok


@pytest.fixture
def client(server):
    """An OpenAI client on the module's ``server`` fixture (a running llminfra server): no
    retries, so a failure shows the first answer."""
    import openai
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)
