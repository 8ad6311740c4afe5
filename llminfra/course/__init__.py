"""Course tooling: notebook helpers, answer checkers, the exercise generator, grading, teaching.

* :mod:`llminfra.course.notebook` — ``setup()``, ``show_source``, ``environment_report``;
* :mod:`llminfra.course.checking` — the checker framework (``run_checks``, ``Case``, seeds,
  ``CheckFailed`` / ``NotAttempted``), with :mod:`llminfra.course.compare` (type-tolerant
  comparison that names the first mismatch and the largest difference);
* :mod:`llminfra.course.checks` — one module of checkers per chapter (``ch01``, ``ch02``, …);
* ``python -m llminfra.course.exercises [--check]`` — ``exercises/`` from ``solutions/``, with
  nbgrader metadata on answer and checker cells;
* ``python -m llminfra.course.grade DIR [--csv PATH] [--summary]`` — grade a folder of learners'
  notebooks (:mod:`~llminfra.course.grade_kernel` runs each one, :mod:`~llminfra.course.
  grade_guard` keeps the package pristine for the checkers inside that kernel,
  :mod:`~llminfra.course.grade_report` writes the report, summary and CSV);
* ``python -m llminfra.course.teach check-machines | reset-exercises`` — a teacher's commands;
* ``python -m llminfra.course.execute NOTEBOOK…`` — re-run notebooks and store their outputs,
  widget state and run times;
* :mod:`llminfra.course.chapters` — the course map read from the notebooks (chapter 00);
* :mod:`llminfra.course.glossary` (data in :mod:`~llminfra.course.glossary_terms`) — the
  English / Korean glossary: search, ``docs/glossary.md``, links from each chapter's first use.
"""
