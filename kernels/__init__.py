"""Fused Triton kernels, installed as ``dspark.kernels``.

Importing this package does not import Triton; each launcher imports it on first call. Kernels never
import dspark.reference: the tests hold them to it.
"""
