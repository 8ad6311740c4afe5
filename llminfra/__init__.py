"""llminfra: the package behind the LLM inference infrastructure course.

Sub-packages follow the course (see README.md): ``specs`` (facts as data), ``calc``
(closed-form models), ``model`` (the tiny decoder), ``attention``, ``kvcache``, ``quant``,
``parallel``, ``widgets``, ``plots``, ``course`` and ``bench``.
"""

__version__ = "0.1.0"
