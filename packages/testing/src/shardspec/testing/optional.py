"""Optional dependencies of the tests: installed, or not, or installed but unable to load.

TorchRec's kernels (fbgemm-gpu-cpu) are a native library built against one torch release;
installed beside another (fbgemm-gpu-cpu 1.9.0 with torch 2.15.0) ``import torchrec`` raises
``OSError: ... undefined symbol`` instead of ``ImportError``. A test that needs TorchRec then
skips with the loader's own words, as it does when TorchRec is missing: never a collection
error, and never a known defect "reproduced" by a library that did not load.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType

__all__ = ["import_error", "import_or_skip", "torchrec_error"]


@cache
def import_error(module: str) -> str | None:
    """Why ``module`` cannot be imported here (missing, or installed but its native code does
    not load against this torch), or None when it imports."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        return f"{module} is not installed ({e})"
    except OSError as e:  # a shared library built for another torch
        import torch

        # torch.ops.load_library says which file; the loader's error (undefined symbol) is
        # the cause it chains
        why = f"{e}" + (f" ({e.__cause__})" if e.__cause__ is not None else "")
        return f"{module} is installed but does not load with torch {torch.__version__}: {why}"
    return None


def torchrec_error() -> str | None:
    """Why TorchRec (with fbgemm-gpu-cpu, which its sharded modules load) cannot run here."""
    return import_error("torchrec") or import_error("fbgemm_gpu")


def import_or_skip(module: str, hint: str = "") -> ModuleType:
    """``pytest.importorskip`` that also skips, with the loader's error, when the module is
    installed but cannot load; ``hint`` says how to get it."""
    import pytest

    error = import_error(module)
    if error is not None:
        missing = error.endswith(")") and "is not installed" in error
        pytest.skip(f"{error}; {hint}" if hint and missing else error, allow_module_level=True)
    return importlib.import_module(module)
