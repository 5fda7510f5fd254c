"""Kernels: C sources for the CPU (`cpu/`), Triton for CUDA (`triton/`)."""
