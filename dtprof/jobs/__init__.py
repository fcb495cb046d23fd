"""Small real distributed training jobs on CPU/gloo: the demo, sample traces, tests, benchmarks."""
