"""Graded tests: one file per part of the assignment (assignment.py); python -m course.grade runs them.

A part's tests import only the file the part lives in. ``losses.py`` and ``rewards.py``
import no other part's file; ``train.py`` imports both, so the completion_mask tests load it
with ``load_alone``: a broken (or hostile) losses.py then costs the losses parts only.
"""
import importlib.util
import os
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PART_FILES = ("losses", "rewards", "train")


def _stand_in(name):
    """A module whose every attribute is a function that raises: what ``from <name> import x``
    gets instead of a real part file."""
    module = types.ModuleType(name, f"stand-in for {name}.py while another part's file is graded")

    def attribute(attr):
        def unavailable(*args, **kwargs):
            raise RuntimeError(f"{name}.{attr} is not available here: this test grades another file")
        return unavailable

    module.__getattr__ = attribute
    return module


def load_alone(name):
    """The part file ``name`` ("losses", "rewards" or "train"), freshly imported with the other
    part files replaced by stand-ins, so that none of their code runs. sys.modules is left as
    it was: the rest of the test suite still imports the real modules."""
    ours = lambda: {key for key, m in sys.modules.items()
                    if str(getattr(m, "__file__", None) or "").startswith(str(ROOT) + os.sep)}
    before = {key: sys.modules[key] for key in ours() | set(PART_FILES) if key in sys.modules}
    for other in PART_FILES:
        sys.modules.pop(other, None)
        if other != name:
            sys.modules[other] = _stand_in(other)
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for key in ours() | set(PART_FILES):         # forget what was imported next to the stand-ins
            sys.modules.pop(key, None)
        sys.modules.update(before)
    return module
