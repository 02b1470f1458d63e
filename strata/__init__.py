"""strata: PyTorch programs lowered through six printable stages into fused GPU kernels."""
