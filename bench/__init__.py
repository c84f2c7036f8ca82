"""memtrace's benchmarks: bench/targets (the figures held against targets,
run by bench/run_all.py), bench/experiments (one-off measurements) and
bench/harness.py, what they share."""
