"""DCP's FileSystemReader reads whatever file a storage entry of ``.metadata`` names: a
``relative_path`` of ``../other/...`` (or an absolute path) is read from outside the
checkpoint's directory, and the load returns."""

import os
import pickle
import shutil
import sys
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp

DEFECT = {
    "id": "dcp-load-follows-paths-outside-the-checkpoint",
    "title": "DCP's FileSystemReader reads data files named outside the checkpoint's directory",
    "area": "checkpoint",
    "rule": "CKPT-5",
    "upstream": None,
    "issue_text": (
        "## DCP: a storage entry's relative_path is followed outside the checkpoint\n\n"
        "`FileSystemReader.read_data` opens `checkpoint_id / relative_path` for every storage "
        "entry of `.metadata`, and nothing checks that the name stays inside the checkpoint: "
        "`../elsewhere/__0_0.distcp` or `/abs/path` is read as the tensor's bytes. A "
        "checkpoint copied from an untrusted source can make a job read (and, through a "
        "training run, publish) any file the job can open; a moved or hand-edited one loads "
        "another checkpoint's data without a word. DCP's writer only writes plain file "
        "names.\n\n"
        "**Expected**: the load raises, naming the entry, before any read.\n\n"
        "**Actual**: it reads the outside file and returns.\n\n"
        "Versions: torch 2.13.0 (CPU), Python 3.11."
    ),
    "nproc": 1,
    "torch_does": "loads a tensor whose storage entry names '../elsewhere/__0_0.distcp', read "
    "from a directory beside the checkpoint",
    "spec_says": "a storage entry naming a file outside the checkpoint's directory is refused "
    "before any read (CKPT-5)",
    "tests": [
        "test_checkpoint_collective_load.py::"
        "test_a_collective_load_refuses_fields_no_dcp_writer_writes_on_every_rank",
    ],
}

root = tempfile.mkdtemp()
ckpt, elsewhere = os.path.join(root, "ckpt"), os.path.join(root, "elsewhere")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dcp.save({"t": torch.arange(6.0)}, checkpoint_id=ckpt, no_dist=True)
    # the data file moves beside the checkpoint; .metadata (our own, trusted) names it there
    os.makedirs(elsewhere)
    meta = os.path.join(ckpt, ".metadata")
    with open(meta, "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        if os.path.exists(os.path.join(ckpt, info.relative_path)):
            shutil.move(os.path.join(ckpt, info.relative_path), elsewhere)
        info.relative_path = f"../elsewhere/{info.relative_path}"
    with open(meta, "wb") as f:
        pickle.dump(md, f)
    target = torch.zeros(6)
    try:
        dcp.load({"t": target}, checkpoint_id=ckpt, no_dist=True)
    except BaseException as e:  # CheckpointException is a BaseException
        print(f"refused: {type(e).__name__}")
        sys.exit(0)
print(
    f"DIVERGES rank 0: torch loads t = {target.tolist()} from ../elsewhere/, outside the "
    "checkpoint; the spec says an entry naming a file outside the checkpoint is refused"
)
sys.exit(1)
