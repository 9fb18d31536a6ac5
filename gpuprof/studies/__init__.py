"""Every chapter's experiments: the modules that run a named example script and return a chapter's tables.

A study may import the core, the tool packages and ``report``, never another study (see the
layout rule in :mod:`gpuprof`).
"""
