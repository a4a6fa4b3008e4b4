"""Run by `nox -s wheels` in a venv that holds only torch and the wheels pip pulled from dist/:
each expected shardspec package imports from site-packages (never the checkout), carries its
py.typed marker, and torch is still the version installed before it.

    python check_installed.py CHECKOUT TORCH_VERSION shardspec.metadata shardspec.reshard ...
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(checkout: str, torch_version: str, modules: list[str]) -> None:
    root = Path(checkout).resolve()
    for name in modules:
        module = importlib.import_module(name)
        where = Path(module.__file__ or "").resolve()
        if where.is_relative_to(root) and ".nox" not in where.parts:
            sys.exit(f"{name} imported from the checkout ({where}), not from the installed wheel")
        if not (where.parent / "py.typed").is_file():
            sys.exit(f"{name} at {where.parent} has no py.typed marker")
        print(f"{name}: {where.parent}")
    import torch

    if torch.__version__.split("+")[0] != torch_version:
        sys.exit(f"torch is {torch.__version__} after the install, not {torch_version}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
