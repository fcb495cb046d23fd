"""Recording inside a training job: the only package that imports torch."""
