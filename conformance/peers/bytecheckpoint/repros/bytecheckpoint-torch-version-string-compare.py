"""ByteCheckpoint 0.0.2 checks the torch release by comparing version strings.

Install: pip install torch==2.13.0 && pip install --no-deps bytecheckpoint==0.0.2 mmh3==4.1.0
universal-pathlib cachetools safetensors numpy typing-extensions grpcio==1.69.0 protobuf==3.20.3
(ByteCheckpoint 0.0.2 pins torch<=2.5.0). Run: python this-file.py (one process, no I/O).
"""

import sys

DEFECT = {
    "id": "bytecheckpoint-torch-version-string-compare",
    "title": "ByteCheckpoint 0.0.2 compares torch.__version__ as a string: 2.10 and later pass "
    "its 2.1-2.5 check",
    "area": "checkpoint_libraries",
    "rule": "CKPT-20",
    "upstream": None,
    "issue_text": """### The torch version check compares strings

`FSDP2Checkpointer.save` / `load` (and `FSDPCheckpointer`, `DDPCheckpointer`) assert
`"2.1.0" <= torch.__version__.strip() and torch.__version__.strip() < "2.6.0"`. `.strip()`
returns a plain `str`, so the comparison is lexicographic: `"2.13.0" < "2.6.0"` is true, and
torch 2.10 and later pass a check meant to allow 2.1 to 2.5 only (the package pins
`torch<=2.5.0`), while 2.6 to 2.9 are refused. Repro: this file, bytecheckpoint 0.0.2,
torch 2.13.0.

Expected: the release compared by number (`packaging.version.Version(torch.__version__)`, or
`torch.__version__` itself, a `TorchVersion` that compares by number), so a release is
accepted exactly when it is in the supported range.""",
    "nproc": 1,
    "impl": "bytecheckpoint",
    "needs": ["bytecheckpoint"],
    "torch_does": "save accepts torch 2.10.0, 2.13.0 and 2.15.0 (string order) although its "
    "stated range is 2.1 to 2.5",
    "spec_says": "which torch releases a checkpoint library runs on is decided by release number",
    "tests": ["test_checkpoint_libraries.py::test_the_torch_release_check_goes_by_number"],
}

try:
    import torch
    from bytecheckpoint.checkpointer.fsdp2_checkpointer import FSDP2Checkpointer
except (ImportError, OSError) as e:
    print(f"SKIPPED bytecheckpoint does not load ({type(e).__name__}: {e})")
    sys.exit(0)

real, wrong = torch.__version__, []
for release in ("2.5.1", "2.6.0", "2.9.1", "2.10.0", "2.13.0", "2.15.0"):
    torch.__version__ = release  # what its check reads; save({}) stops right after it
    accepted = True
    try:
        FSDP2Checkpointer.save("/nonexistent", {})
    except AssertionError as e:
        accepted = "only support torch version" not in str(e)  # next: "Model is a must"
    finally:
        torch.__version__ = real
    by_number = (2, 1) <= tuple(int(x) for x in release.split(".")[:2]) < (2, 6)
    print(f"torch {release}: accepted={accepted}, by number {by_number}")
    if accepted != by_number:
        wrong.append(release)
if wrong:
    print(
        f"DIVERGES rank 0: ByteCheckpoint accepts torch {', '.join(wrong)} (string order); "
        "the spec says 2.1 <= release < 2.6 by number"
    )
    sys.exit(1)
