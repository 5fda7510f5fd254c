"""Turns virtual CUDA on at start-up in every Python process whose path holds this folder.

`python -m roseinfer.testing.virtual_cuda COMMAND...` (or `virtual_cuda.process_env()`)
puts this folder on PYTHONPATH with ROSEINFER_VIRTUAL_CUDA=1, so the command and
every Python process it starts (a server a notebook launches) run their CUDA
branches on CPU tensors, while roseinfer itself never imports the test mode.
"""

import os

if os.environ.get("ROSEINFER_VIRTUAL_CUDA") == "1":
    from roseinfer.testing import virtual_cuda

    virtual_cuda.enable()
