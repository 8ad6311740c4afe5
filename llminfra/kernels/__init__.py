"""The package's CPU kernel library: C sources under one header, built visibly, with a torch
path wherever it cannot be built.

* ``csrc/`` — the C sources: the thread pool, int4 × int8 products (``w4a8.c``), fp32 products
  of few rows (``f32_skinny.c``) and of many on packed panels (``f32_panels.c``), paged decode
  attention read in place (``paged_decode.c``), a whole decode step (``decode_stack.c``);
* :mod:`.build` — compiling them into one shared library, visibly, a failure remembered;
  :mod:`.cache` — the cache folder it goes to and how a cached file is trusted;
  :mod:`.cli` — ``python -m llminfra kernels build|info``;
* :mod:`.abi` — every exported function's types, the C structures and error codes, declared
  once; :mod:`.library` — the library loaded once a process, :class:`~.library.ThreadPool`;
* :mod:`.w4a8` — the int4 × int8 products; :mod:`.f32_skinny` — the fp32 products;
  :mod:`.paged_decode` — the attention and RoPE write;
* :mod:`.huge_pages` — weights on 2 MB pages.

Nothing here knows the model: :mod:`llminfra.runner` builds the fused weights on these
kernels. Chapter 12.
"""
