"""Helpers of the case-study chapters: analyses specific to one example program."""
