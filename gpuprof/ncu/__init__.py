"""Nsight Compute: running ncu over a script, and reading what it wrote.

* :mod:`gpuprof.ncu.csv_reader`: ``ncu --csv`` output (``--page details`` and ``--page raw``)
* :mod:`gpuprof.ncu.report`: ``.ncu-rep`` reports through NVIDIA's ``ncu_report`` module
* :mod:`gpuprof.ncu.capture`: ``ncu`` over a course script, filed with provenance (the course's
  reference report when there is no GPU, no ncu or no counter permission)
* :mod:`gpuprof.ncu.plots`: speed of light, roofline, stall reasons, occupancy limiters
"""
