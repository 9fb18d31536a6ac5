"""A glued value reaches the prose as the number it is, never as NumPy's repr."""

import numpy as np
import pandas as pd

from gpuprof.book import plain


def test_numpy_scalars_become_python_numbers_and_the_rest_is_untouched():
    median = pd.Series([15.0, 15.5, 16.0]).median()
    assert repr(np.float64(1.85)).startswith("np.float64")  # what the prose showed before (NumPy 2)
    assert repr(plain(round(np.float64(1.85), 2))) == "1.85"
    assert type(plain(median)) is float and type(plain(np.int64(7))) is int
    for value in (1.5, 3, "NVIDIA H100", None):
        assert plain(value) is value
