"""Code the benchmark scripts share: `record` writes every benchmark's record, `attention` holds the parts of the
attention benchmark (shapes, runners, timing, plot, its record's ratio table), `train` those of the training
benchmark (jobs in fresh processes, the longest-seq_len search, its record).

The scripts import it as a sibling package: `python scripts/<benchmark>.py` puts scripts/ first on the path. It lives
beside the scripts, not in legalpt, so that a benchmark can measure another tree's legalpt (scripts/ab_attention.py
puts an older commit's legalpt first on the path) with this checkout's benchmark code.
"""
