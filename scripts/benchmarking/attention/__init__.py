"""The attention benchmark's parts (scripts/bench_attention.py runs them): `shapes` plans what is measured and counts
its FLOPs, `runners` turns each implementation into a forward on seeded inputs, `timing` measures a step, `plot`
draws the dense sweep, `record` turns rows into the ratio table and merges the parts of a split run."""
