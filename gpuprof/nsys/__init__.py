"""Nsight Systems: captures, readers of its sqlite export, and what the course derives from them.

* :mod:`gpuprof.nsys.capture`: ``nsys profile`` over a script, exported and filed with provenance
  (the course's reference capture when there is no GPU or no nsys)
* :mod:`gpuprof.nsys.session`: the interactive mode (launch now, record a window later)
* :mod:`gpuprof.nsys.sqlite`: readers of the sqlite export (kernels, copies, API calls, NVTX, ...)
* :mod:`gpuprof.nsys.stats`: the ``nsys stats`` summary reports, column for column (``nvtx_kern_sum`` too)
* :mod:`gpuprof.nsys.recipes`: ``nsys recipe`` outputs set beside the gpuprof measures they equal
* :mod:`gpuprof.nsys.rules`: ``nsys analyze``, nsys's own rules (pageable copies, synchronisations,
  GPU gaps), run on a report
* :mod:`gpuprof.nsys.analysis`: busy time, idle gaps, overlap, launch latency, attribution to ranges
  (re-exported from :mod:`gpuprof.activity`: the same measures serve PyTorch profiler traces)
* :mod:`gpuprof.nsys.timeline`: the timeline figure
"""
