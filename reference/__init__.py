"""Slow oracles: loops that mirror the formulas of paper/method.md line by line, float64-capable, CPU only.

Installed as ``dspark.reference``. Every module in dspark/ and every kernel in dspark.kernels is tested
against the function of the same name here.
"""
