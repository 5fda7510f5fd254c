"""Test support that ships with the package: the virtual-CUDA mode (CUDA branches on a CPU)."""
