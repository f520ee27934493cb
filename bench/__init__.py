"""nri-cni's benchmarks: `python -m bench` runs them all and prints one table (bench/README.md)."""
