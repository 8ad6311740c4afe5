"""``python -m llminfra …`` — see :mod:`llminfra.cli`."""

from llminfra.cli import main

raise SystemExit(main())
