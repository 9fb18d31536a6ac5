"""Hand numbers from an executed notebook to the book's prose pages.

The prose pages (``book/*.md``) are not executed; they quote chapter results through
myst-nb's *glue*: a notebook cell stores a value under a key in its outputs, and a
page writes ``{glue:text}`\\`../notebooks/00__setting_up.ipynb::h2d_pinned:.1f\\```.
So a number in the prose is always the one the stored notebook computed from its
capture, never a copy typed by hand.

The GPU machine that executes the notebooks need not have myst-nb installed, so
:func:`glue` writes the same output myst-nb's own ``glue`` writes (a display_data
output whose metadata names the key) when myst-nb is absent.
"""

from __future__ import annotations

from typing import Any

__all__ = ["glue", "plain"]

GLUE_PREFIX = "application/papermill.record/"


def plain(value: Any) -> Any:
    """A NumPy scalar as the Python number it holds; anything else as it is.

    A glued value is shown by its ``repr``, and NumPy 2 writes a scalar's as ``np.float64(1.85)``:
    a median taken with pandas or NumPy would reach the prose in that form.
    """
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


def glue(name: str, value: Any, display: bool = False) -> None:
    """Store ``value``'s display form under ``name`` in the running cell's outputs (a NumPy scalar as a
    plain number, see :func:`plain`)."""
    value = plain(value)
    try:
        from myst_nb import glue as nb_glue
    except ImportError:
        nb_glue = None
    if nb_glue is not None:
        nb_glue(name, value, display=display)
        return
    import IPython
    from IPython.display import display as ipy_display

    bundle, metadata = IPython.core.formatters.format_display_data(value)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    ipy_display({prefix + k: v for k, v in bundle.items()}, raw=True, metadata=metadata)
