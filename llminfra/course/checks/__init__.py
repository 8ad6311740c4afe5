"""Answer checkers, one module per chapter: ``from llminfra.course.checks import ch02``.

How a checker is written (every chapter the same way, see ``ch02.check_largest_batch``)::

    @checker                                    # its own bugs become CheckFailed, never a crash
    def check_thing(fn, seed: int | None = None) -> int:
        seed, rng = seeded(seed)                # one seed: the cases replay exactly
        cases = [Case("GQA 8 query heads over 2 KV heads, causal, T=37 S=64", (q, k, v, True))]
        cases += [...]                          # every case the instructions name, first and
                                                # always; then random ones drawn from rng
        return run_checks("thing", fn, reference, cases, rel=1e-9, hint=_hint, seed=seed,
                          replay="chNN.check_thing")

* a case's name says its shapes and options, never its numbers;
* tensors come from ``torch_generator(rng)``, never the global torch random state;
* ``_hint(args, kwargs, expected, got)`` gets ``got`` converted to ``expected``'s kind and names
  the bug the answer actually has, e.g. ``first_matching(got, {"you forgot …": wrong}, expected)``;
* the inputs are handed as copies and an answer that changes one fails (``pure=False`` only
  where changing it is the exercise); ``normalize=`` to check the types the instructions
  require; ``owner=fn`` when the learner is wrapped (so the stub's ``NotImplementedError`` reads
  as "not attempted"); ``on_error=`` for a hint on an exception; ``mistakes=`` the usual wrong
  formulas, tried on every case (``ch08``, ``ch10``); ``speed=Speed(...)`` where the
  exercise's point is speed (``ch03.check_quantize_int4``, ``ch06.check_tiled_attention``);
* every checker is in ``tests/test_checks_rules.py``: one verdict over 50 seeds, fresh cases
  that a remembering answer fails, a changed input named.
"""
