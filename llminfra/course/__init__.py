"""Course tooling: notebook helpers, answer checkers, the exercise generator, grading, teaching.

* :mod:`llminfra.course.notebook` — ``setup()``, ``show_source``, ``environment_report``;
* :mod:`llminfra.course.checking` — the checker framework (``run_checks``, ``Case``, seeds,
  ``CheckFailed`` / ``NotAttempted``), with :mod:`llminfra.course.compare` (type-tolerant
  comparison that names the first mismatch and the largest difference) and the rules every
  checker follows, one module each: :mod:`~llminfra.course.check_failures` (the verdicts and
  their three-line messages), :mod:`~llminfra.course.check_inputs` (cases, and answers that
  change their inputs), :mod:`~llminfra.course.check_calls` (calling an answer: the stub versus
  torch's own ``NotImplementedError``), :mod:`~llminfra.course.check_diagnosis` (the wrong type,
  the usual mistake named), :mod:`~llminfra.course.check_speed` (right but slow);
* :mod:`llminfra.course.checks` — one module of checkers per chapter (``ch01``, ``ch02``, …);
* ``python -m llminfra.course.exercises [--check]`` — ``exercises/`` from ``solutions/``, with
  nbgrader metadata on answer and checker cells;
* ``python -m llminfra.course.grade DIR [--csv PATH] [--summary]`` — grade a folder of learners'
  notebooks (:mod:`~llminfra.course.grade_cells` finds the notebooks and their checker cells,
  :mod:`~llminfra.course.grade_sandbox` gives each its own throwaway copy of the course,
  :mod:`~llminfra.course.grade_kernel` runs each one, :mod:`~llminfra.course.
  grade_guard` keeps the package pristine for the checkers inside that kernel,
  :mod:`~llminfra.course.grade_status` reads each checker cell's status,
  :mod:`~llminfra.course.grade_report` writes the report, summary and CSV,
  :mod:`~llminfra.course.grade_handback` each student's ``results.json`` and feedback);
* ``python -m llminfra.course.teach check-machines | reset-exercises`` — a teacher's commands;
* ``python -m llminfra.course.execute NOTEBOOK…`` — re-run notebooks and store their outputs,
  widget state and run times;
* :mod:`llminfra.course.chapters` — the course map read from the notebooks (chapter 00);
* :mod:`llminfra.course.glossary` (data in :mod:`~llminfra.course.glossary_terms`) — the
  English / Korean glossary: search, ``docs/glossary.md``, links from each chapter's first use.
"""
