"""Keep the package pristine for the checkers while a learner's notebook is graded.

A checker computes its expected values with the package (``ch07.check_bubble`` calls
``llminfra.parallel.pipeline.bubble_fraction``). An answer cell that replaces that function — by
accident or not — would make a wrong answer agree with its own reference. This guard runs
*inside the kernel* that executes the notebook; the grader (:mod:`llminfra.course.grade_kernel`)
sends this file's source as a first cell, executed in a private namespace (so the guard is not
itself a module an answer could patch through ``sys.modules``). From then on:

* every ``llminfra`` module is remembered as it was right after its import (the modules already
  imported, the chapter's checker module imported at once with its references, and every later
  import, through a finder on ``sys.meta_path``): its names, the attributes of the classes it
  defines, the code, defaults and closure of its functions, the contents of its module-level
  dicts, lists and sets; of ``builtins``, ``math``, ``operator``, ``numbers``, ``fractions``,
  ``random``, ``torch`` and ``numpy``, the top-level functions and classes;
* before each checker :meth:`Guard.before_check` puts all of that back (``sys.modules`` entries
  too), names what it found changed, and after the checker :meth:`Guard.after_check` re-applies
  the learner's changes, so the rest of the notebook runs as they wrote it.

Restoring keeps every object's identity (the class ``BlockPoolExhausted`` an answer raises is
the one the checker catches), which re-importing the package fresh would not. What it does not
cover: state inside objects (a cached registry's entries, a tensor's values, a frozen dataclass
forced with ``object.__setattr__``), other libraries' submodules, and code written to find and
disable the guard itself — the grader defends the package against an answer's changes, not
against an answer that attacks the grader (a teacher reading such an answer sees it).
"""

from __future__ import annotations

import importlib
import sys
import types

PACKAGE = "llminfra"
#: libraries the checkers compute with: their top-level functions and classes are restored
LIBRARIES = ("builtins", "math", "operator", "numbers", "fractions", "random", "torch", "numpy")
#: builtins that the kernel itself rebinds while it runs (ipykernel's input forwarding, IPython)
KERNEL_OWNED = frozenset({"input", "raw_input", "getpass", "exit", "quit", "get_ipython",
                          "display", "help", "open"})
_MISSING = object()


def ours(name: str) -> bool:
    """Is ``name`` the package or one of its modules?"""
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _function_state(f) -> tuple:
    cells = []
    for cell in f.__closure__ or ():
        try:
            cells.append((cell, cell.cell_contents))
        except ValueError:          # an empty cell (a name not bound yet)
            cells.append((cell, _MISSING))
    return f.__code__, f.__defaults__, f.__kwdefaults__, tuple(cells)


def _functions_in(value, module_name: str):
    """The plain functions behind ``value``: itself, a method's, a property's, and those it
    wraps (``functools.wraps``), when they were defined in ``module_name``."""
    found = []
    todo = [value]
    if isinstance(value, (staticmethod, classmethod)):
        todo = [value.__func__]
    elif isinstance(value, property):
        todo = [value.fget, value.fset, value.fdel]
    while todo:
        f = todo.pop()
        if isinstance(f, types.FunctionType) and f.__module__ == module_name and f not in found:
            found.append(f)
            todo.append(getattr(f, "__wrapped__", None))
    return found


class Snapshot:
    """One ``llminfra`` module as it was: names, its classes' attributes, its functions' code,
    defaults and closures, its module-level containers' contents."""

    def __init__(self, name: str, module: types.ModuleType):
        self.name, self.module = name, module
        self.names = dict(vars(module))
        self.classes, self.functions, self.containers = {}, {}, []
        for key, value in self.names.items():
            if key.startswith("__"):
                continue
            if isinstance(value, type) and value.__module__ == name:
                self.classes[value] = dict(vars(value))
                for member in vars(value).values():
                    for f in _functions_in(member, name):
                        self.functions[f] = _function_state(f)
            for f in _functions_in(value, name):
                self.functions[f] = _function_state(f)
            if isinstance(value, (dict, list, set)):
                self.containers.append((key, value, value.copy()))


def _put(target, key, value) -> None:
    """``target[key] = value`` (a dict) or ``setattr`` (a class), deleting for ``_MISSING``."""
    if isinstance(target, dict):
        if value is _MISSING:
            target.pop(key, None)
        else:
            target[key] = value
    elif value is _MISSING:
        delattr(target, key)
    else:
        setattr(target, key, value)


def _shadows(value) -> bool:
    """Could a name added to a module or class change what its code does (a function, a class,
    a descriptor), rather than being data cached there?"""
    return not isinstance(value, types.ModuleType) and (callable(value)
                                                       or hasattr(type(value), "__get__"))


class Guard:
    """Remembers the package as imported; puts it back around each checker (see the module)."""

    def __init__(self, prefix: str = ""):
        self.prefix = prefix          # what starts the guard's own lines (no secret)
        self.snapshots: dict[str, Snapshot] = {}
        self.libraries: dict[str, tuple[types.ModuleType, dict]] = {}
        self._undo: list[tuple] = []
        self._finder = None

    # ------------------------------------------------------------------ remembering
    def watches(self, name: str) -> bool:
        """Is ``name`` remembered when it is imported (the package, or one of LIBRARIES)?"""
        return ours(name) or name in LIBRARIES

    def remember(self, name: str, module) -> None:
        """Record ``module`` as pristine (the first time ``name`` is seen only)."""
        if module is None or name in self.snapshots or name in self.libraries:
            return
        if ours(name):
            self.snapshots[name] = Snapshot(name, module)
        elif name in LIBRARIES:
            kinds = (types.BuiltinFunctionType, type) if name == "builtins" else None
            self.libraries[name] = (module, {
                k: v for k, v in vars(module).items()
                if not k.startswith("__") and k not in KERNEL_OWNED
                and not isinstance(v, types.ModuleType)
                and (isinstance(v, kinds) if kinds else callable(v))})

    def install(self, preload=()) -> Guard:
        """Remember what is imported now, watch later imports, then import ``preload`` (the
        chapter's checker module, so its references are remembered before any answer runs)."""
        for name, module in list(sys.modules.items()):
            if self.watches(name):
                self.remember(name, module)
        if self._finder is None:
            self._finder = _Finder(self)
            sys.meta_path.insert(0, self._finder)
        for name in preload:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - no such checker module: nothing to preload
                pass
        return self

    def uninstall(self) -> None:
        """Stop watching imports (the snapshots are kept)."""
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None

    def module(self, name: str) -> types.ModuleType:
        """The pristine module ``name`` (imported now if it never was)."""
        if name not in self.snapshots:
            importlib.import_module(name)
            self.remember(name, sys.modules.get(name))
        return self.snapshots[name].module

    def has(self, module_name: str, name: str) -> bool:
        """Does the pristine module ``module_name`` (importable at all) define ``name``?"""
        try:
            return hasattr(self.module(module_name), name)
        except ImportError:
            return False

    # ------------------------------------------------------------------ restoring
    def restore(self) -> list[str]:
        """Put every remembered module back as it was; return what had changed (dotted names)
        and keep the learner's values to re-apply with :meth:`reapply`."""
        log = _Changes()
        for name, snap in list(self.snapshots.items()):
            log.put(sys.modules, name, snap.module, f"sys.modules[{name!r}]")
            _restore_names(log, vars(snap.module), snap.names, name)
            for cls, attrs in snap.classes.items():
                _restore_names(log, cls, attrs, f"{name}.{cls.__qualname__}")
            for f, state in snap.functions.items():
                if not _same_state(_function_state(f), state):
                    log.undo.append((f, _function_state(f)))
                    _set_function_state(f, state)
                    log.changed.append(f"{name}.{f.__qualname__} (its code, defaults or closure)")
            for key, live, saved in snap.containers:
                if _differs(live, saved):
                    log.undo.append((live, live.copy()))
                    _refill(live, saved)
                    log.changed.append(f"{name}.{key} (its contents)")
        for name, (module, saved) in self.libraries.items():
            for key, value in saved.items():
                log.put(vars(module), key, value, f"{name}.{key}")
        self._undo = log.undo
        return log.changed

    def reapply(self) -> None:
        """Re-apply the learner's changes that :meth:`restore` took away, newest first."""
        for entry in reversed(self._undo):
            if len(entry) == 3:
                _put(*entry)
            elif isinstance(entry[0], types.FunctionType):
                _set_function_state(*entry)
            else:
                _refill(*entry)
        self._undo = []

    # ------------------------------------------------------------------ around a checker
    def before_check(self) -> None:
        """Restore the package and print one line (after the prefix) naming what had been
        changed."""
        changed = self.restore()
        if changed:
            print(f"{self.prefix} changed {'; '.join(changed)}")

    def after_check(self) -> None:
        """Re-apply the learner's changes (the rest of the notebook runs as they wrote it)."""
        self.reapply()


class _Changes:
    """What :meth:`Guard.restore` changed: dotted names, and how to undo each change."""

    def __init__(self):
        self.changed: list[str] = []
        self.undo: list[tuple] = []

    def put(self, target, key, value, label: str) -> None:
        """``target[key]`` (a dict) or ``target.key`` (a class) made ``value`` again."""
        now = (target if isinstance(target, dict) else vars(target)).get(key, _MISSING)
        if now is value:
            return
        try:
            _put(target, key, value)
        except Exception:  # noqa: BLE001 - say so rather than stop the grading
            self.changed.append(f"{label} (could not be put back)")
            return
        self.undo.append((target, key, now))
        self.changed.append(label)


def _restore_names(log: _Changes, target, saved: dict, where: str) -> None:
    """The names of a module's dict or a class as ``saved``: changed ones put back, added
    ones that could change behaviour (a function shadowing a builtin or an inherited method)
    removed; added data is left."""
    live = target if isinstance(target, dict) else vars(target)
    for key, value in saved.items():
        log.put(target, key, value, f"{where}.{key}")
    for key in [k for k, v in live.items() if k not in saved and _shadows(v)]:
        log.put(target, key, _MISSING, f"{where}.{key}")


def _set_function_state(f, state) -> None:
    code, defaults, kwdefaults, cells = state
    if f.__code__ is not code:
        f.__code__ = code
    f.__defaults__, f.__kwdefaults__ = defaults, kwdefaults
    for cell, value in cells:
        if value is _MISSING:
            try:
                del cell.cell_contents
            except ValueError:
                pass
        else:
            cell.cell_contents = value


def _same_state(a: tuple, b: tuple) -> bool:
    """Two :func:`_function_state` tuples hold the very same objects (identity, never ``==``:
    a default may be a tensor)."""
    return (a[0] is b[0] and a[1] is b[1] and a[2] is b[2] and len(a[3]) == len(b[3])
            and all(x[0] is y[0] and x[1] is y[1] for x, y in zip(a[3], b[3])))


def _differs(live, saved) -> bool:
    if isinstance(live, dict):
        return len(live) != len(saved) or any(live.get(k, _MISSING) is not v
                                              for k, v in saved.items())
    if isinstance(live, list):
        return len(live) != len(saved) or any(a is not b for a, b in zip(live, saved))
    return live != saved


def _refill(live, saved) -> None:
    """Give the container ``live`` the contents ``saved``, keeping its identity."""
    if isinstance(live, list):
        live[:] = saved
    else:
        live.clear()
        live.update(saved)


class _Finder:
    """A ``sys.meta_path`` finder that lets the other finders find a watched module and wraps
    its loader, so the module is remembered right after it executes."""

    def __init__(self, guard: Guard):
        self.guard = guard

    def find_spec(self, fullname, path=None, target=None):
        if not self.guard.watches(fullname):
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.guard)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """The real loader, plus: remember the module once it has executed."""

    def __init__(self, inner, guard: Guard):
        self._inner, self._guard = inner, guard

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        name = module.__spec__.name
        self._guard.remember(name, sys.modules.get(name, module))

    def __getattr__(self, name):
        return getattr(self._inner, name)
