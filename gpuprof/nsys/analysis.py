"""The measures the Nsight Systems chapters derive from a capture, under the name they were taught.

They are not specific to Nsight Systems: the same functions judge a PyTorch profiler
trace, so they live in the shared core, :mod:`gpuprof.activity`, and this module
re-exports them.
"""

from ..activity import *  # noqa: F401,F403
from ..activity import __all__ as _activity_all

__all__ = list(_activity_all)
