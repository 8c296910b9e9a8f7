"""Pure compute: Triton kernels and their torch references. Imports torch and triton only."""
