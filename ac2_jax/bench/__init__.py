"""Benchmarks behind launch/bench.py: one module per subject, each with main(argv)."""
