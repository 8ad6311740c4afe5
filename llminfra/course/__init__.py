"""Course tooling: notebook helpers, answer checkers, the exercise generator, the notebook runner.

* :mod:`llminfra.course.notebook` — ``setup()``, ``show_source``, ``environment_report``;
* :mod:`llminfra.course.checking` — the checker framework (``run_checks``, ``CheckFailed``);
* :mod:`llminfra.course.checks` — one module of checkers per chapter (``ch01``, ``ch02``, …);
* ``python -m llminfra.course.exercises [--check]`` — ``exercises/`` from ``solutions/``;
* ``python -m llminfra.course.execute NOTEBOOK…`` — re-run notebooks and store their outputs.
"""
