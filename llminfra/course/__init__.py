"""Course tooling: notebook helpers, answer checkers, the exercise generator, the notebook runner.

* :mod:`llminfra.course.notebook` — ``setup()``, ``show_source``, ``environment_report``;
* :mod:`llminfra.course.checking` — the checker framework (``run_checks``, ``CheckFailed``);
* :mod:`llminfra.course.checks` — one module of checkers per chapter (``ch01``, ``ch02``, …);
* ``python -m llminfra.course.exercises [--check]`` — ``exercises/`` from ``solutions/``;
* ``python -m llminfra.course.execute NOTEBOOK…`` — re-run notebooks and store their outputs,
  widget state and run times;
* :mod:`llminfra.course.chapters` — the course map read from the notebooks (chapter 00);
* :mod:`llminfra.course.glossary` (data in :mod:`~llminfra.course.glossary_terms`) — the
  English / Korean glossary: search, ``docs/glossary.md``, links from each chapter's first use.
"""
