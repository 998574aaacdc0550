"""`python -m gpubox`: the same entry point as the `gpubox` console script."""

from gpubox.cli import main

if __name__ == "__main__":
    main()
