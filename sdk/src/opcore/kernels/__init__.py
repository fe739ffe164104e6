"""Kernel packages shipped with the core.

`opcore.kernels.triton` holds the portable Triton providers shared by the cuda, rocm and
xpu platforms. Importing a kernel package registers its providers on `opcore.ir` ops.
"""
