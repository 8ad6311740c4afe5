"""The package's CPU kernel library: C sources under one header, built visibly, with a torch
path wherever it cannot be built.

* ``csrc/`` — the C sources: the thread pool, int4 × int8 products (``w4a8.c``), fp32 products
  of few rows (``f32_skinny.c``) and of many on packed panels (``f32_panels.c``), paged decode
  attention read in place (``paged_decode.c``), a whole decode step (``decode_stack.c``);
* :mod:`.build` — compiling them into one shared library in a cache folder
  (``python -m llminfra kernels build|info``);
* :mod:`.w4a8` — loading the library; the int4 × int8 products; :class:`~.w4a8.ThreadPool`;
* :mod:`.f32_skinny` — the fp32 products; :mod:`.paged_decode` — the attention and RoPE write;
* :mod:`.huge_pages` — weights on 2 MB pages.

Nothing here knows the model: :mod:`llminfra.runner` builds the fused weights on these
kernels. Chapter 12.
"""
