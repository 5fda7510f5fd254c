"""Paged attention backends: a protocol, the torch reference, the CPU C kernel, Triton."""
