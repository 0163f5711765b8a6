"""The training benchmark's parts (scripts/bench_train.py runs them): `runs` starts one `legalpt-train` job in a
fresh process and reads its row from metrics.jsonl, `search` chooses the next seq_len of the search for the longest
one that trains, `record` merges rows into the record, adds the ratios against sdpa and prints the tables."""
