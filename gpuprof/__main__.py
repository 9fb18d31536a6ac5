"""``python -m gpuprof report ...`` / ``python -m gpuprof diff ...``: see :mod:`gpuprof.report`."""

from gpuprof.report.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
