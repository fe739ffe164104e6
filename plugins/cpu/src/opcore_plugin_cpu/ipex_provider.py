"""The `ipex` provider: ops that intel-extension-for-pytorch implements for the CPU.

Registered only when IPEX imports; otherwise this module does nothing.
"""
