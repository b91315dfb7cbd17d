"""cutpoint.bench: benchmarks (tables and JSON, never timed tests)."""
