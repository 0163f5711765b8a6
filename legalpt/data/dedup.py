"""Removal of exact and near-duplicate, and contained, documents across the whole corpus.

`deduplicate(documents, cfg, num_proc)` keeps the first occurrence of each document, in the original order:

- exact: documents whose normalized text (lowercased, whitespace runs collapsed) has the same BLAKE2b hash as an
  earlier one's;
- near: MinHash signatures (datasketch) of the sets of `shingle_words`-word shingles, indexed with MinHashLSH. A
  document is a near duplicate when an earlier kept document is among its LSH candidates and the Jaccard similarity
  of their shingle sets is at least `threshold`. Documents shorter than one shingle have no signature: only exact
  dedup applies.

  The banding (b bands of r rows) is chosen for the threshold, not left to datasketch's default (which makes a pair
  at Jaccard 0.80 a candidate only ~40% of the time): the most rows per band, hence the fewest false candidates, with
  which a pair exactly at the threshold still shares a band with probability 1 - (1 - t^r)^b >= 95% (`bands`). Each
  candidate is then verified on the true Jaccard of the two shingle sets, recomputed from the texts, so no pair below
  the threshold is removed; the MinHash estimate only skips candidates far below it (more than 4 standard errors) before
  that costlier check. With the default 128 permutations the estimate alone could not do both: its standard error at
  0.8 is 0.035, so a pair at the threshold would pass half the time and one at 0.75 a tenth of the time.
- containment: among the documents left, one whose shingles lie for at least `containment_threshold` of them within
  a longer kept document (an agreement filed again with an exhibit, an order quoted whole in an opinion) is removed,
  and counted apart. The longer one is kept, so no text is lost; Jaccard misses such pairs, since the exhibit fills
  the union (an agreement plus an exhibit as long as itself has Jaccard 0.5 with it). The container must hold text
  of its own: when it too lies within the document for `containment_threshold` of its shingles, the two are near
  copies of each other, which `threshold` alone decides. Documents are decided from the longest down, and a document
  is only removed for a container that is itself kept. Candidates come from an LSH
  Ensemble (datasketch's `MinHashLSHEnsemble`: the documents partitioned by size, each partition banded for the
  Jaccard that the containment threshold implies at its sizes), tuned to favour recall; each is verified on the true
  containment of the shingle sets, so no document below the threshold is removed.

Hashes and signatures are computed in parallel with `datasets.map`; the in-order pass over them is sequential, because
whether a document is kept depends on every document before it.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from collections.abc import Callable
from typing import Any

import datasets
import numpy as np
from datasketch import LeanMinHash, MinHash, MinHashLSH, MinHashLSHEnsemble

from legalpt.config import DedupConfig

_SEED = 1  # seed of the MinHash permutations: fixed, so signatures are identical in every process and run
_SCHEME = "affine32"  # datasketch's permutation scheme; signatures are uint32
_CANDIDATE_PROBABILITY = 0.95  # chance that a pair exactly at the threshold becomes an LSH candidate, at least
# The LSH Ensemble's weights of false positives and false negatives: misses cost more than candidates, which the
# estimate and the exact check reject. With equal weights it found 12% of the pairs at containment 0.9 where the
# container was twice as long; with these, 99% of those of containment >= 0.9 with containers up to 9 times as long.
_CONTAINMENT_WEIGHTS = (0.01, 0.99)
_CACHED_SETS = 256  # shingle sets kept in memory for the exact checks (8 bytes a shingle)
_NO_SIGNATURE = np.zeros(0, np.uint32)  # typed, so that a batch mixing it with signatures converts to one Arrow type
_FEATURES = datasets.Features(
    {
        "exact_hash": datasets.Value("string"),
        "minhash": datasets.List(datasets.Value("uint32")),
        "shingles": datasets.Value("int64"),
    }
)


def deduplicate(documents: datasets.Dataset, cfg: DedupConfig, num_proc: int = 1) -> tuple[datasets.Dataset, dict]:
    """The documents without exact and near duplicates (first occurrence kept, order preserved) nor contained ones,
    and a report: `{"documents", "kept", "exact_duplicates", "near_duplicates", "containment_duplicates",
    "too_short_for_near", "examples"}`, where `too_short_for_near` counts the documents, not exact duplicates, that
    near dedup and containment could not check because they are shorter than one shingle (0 when both are off), and
    `examples` lists up to `cfg.examples` pairs `{"kept_id", "removed_id", "kind": "exact" | "near" | "containment",
    "similarity"}`: the Jaccard similarity of the shingle sets for near duplicates, the share of the removed
    document's shingles found in the kept one for contained ones (both to 4 decimals), 1.0 for exact ones."""
    _check(documents, cfg, num_proc)
    report: dict[str, Any] = {
        "documents": documents.num_rows,
        "kept": documents.num_rows,
        "exact_duplicates": 0,
        "near_duplicates": 0,
        "containment_duplicates": 0,
        "too_short_for_near": 0,
        "examples": [],
    }
    if documents.num_rows == 0 or not (cfg.exact or cfg.near or cfg.containment):
        return documents, report
    signatures = documents.select_columns(["text"]).map(
        functools.partial(
            _signatures, shingle_words=cfg.shingle_words, num_perm=cfg.num_perm, near=cfg.near or cfg.containment
        ),
        batched=True,
        batch_size=64,
        remove_columns=["text"],
        features=_FEATURES,
        num_proc=num_proc if num_proc > 1 else None,
        desc="dedup signatures",
    )
    shingles = _shingle_sets(documents, cfg.shingle_words)
    keep = _scan(signatures, documents, cfg, report, shingles)
    if cfg.containment:
        keep = _without_contained(keep, signatures, documents["id"], cfg, report, shingles)
    report["kept"] = len(keep)
    return (documents if len(keep) == documents.num_rows else documents.select(keep)), report


def normalize(text: str) -> str:
    """The text compared for exact duplicates: lowercased, whitespace runs collapsed to one space, stripped."""
    return " ".join(text.lower().split())


def bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(b, r), the LSH banding for `threshold`: the most rows per band r, with b = num_perm // r bands (at least 2,
    datasketch's minimum), such that a pair at the threshold becomes a candidate with probability
    1 - (1 - threshold^r)^b >= 95%; one row per band (the most candidates) when no banding reaches it."""
    for rows in range(num_perm // 2, 1, -1):
        if candidate_probability(threshold, num_perm // rows, rows) >= _CANDIDATE_PROBABILITY:
            return num_perm // rows, rows
    return num_perm, 1


def candidate_probability(similarity: float, b: int, r: int) -> float:
    """Probability that two documents of Jaccard `similarity` share at least one of b LSH bands of r rows."""
    return 1 - (1 - similarity**r) ** b


def _shingles(normalized: str, shingle_words: int) -> set[str]:
    """The set of `shingle_words`-word shingles of a normalized text (empty when it is shorter than one shingle)."""
    words = normalized.split()
    return {" ".join(words[i : i + shingle_words]) for i in range(len(words) - shingle_words + 1)}


def _signatures(batch: dict[str, list], shingle_words: int, num_perm: int, near: bool) -> dict[str, list]:
    """Exact-match hash, MinHash signature (empty when `near` is off or the text is shorter than one shingle) and
    number of distinct shingles of each text of a batch."""
    # CRC-32 instead of datasketch's default SHA-1: several times faster, and datasketch mixes every input hash
    # (MurmurHash3's finalizer) before permuting it. Permutations are drawn once per batch.
    template = MinHash(num_perm=num_perm, seed=_SEED, scheme=_SCHEME, hashfunc=zlib.crc32)
    hashes, minhashes, sizes = [], [], []
    for text in batch["text"]:
        normalized = normalize(text)
        hashes.append(hashlib.blake2b(normalized.encode(), digest_size=16).hexdigest())
        shingles = _shingles(normalized, shingle_words)
        sizes.append(len(shingles))
        if not near or not shingles:
            minhashes.append(_NO_SIGNATURE)
            continue
        minhash = template.copy()
        minhash.update_batch([shingle.encode() for shingle in shingles])
        minhashes.append(minhash.hashvalues)  # (num_perm,) uint32
    return {"exact_hash": hashes, "minhash": minhashes, "shingles": sizes}


def _shingle_sets(documents: datasets.Dataset, shingle_words: int) -> Callable[[int], np.ndarray]:
    """The shingle set of the document at an index, recomputed from its text, as the sorted distinct 64-bit hashes of
    its shingles: compact enough to cache the last `_CACHED_SETS` (a kept document is often the candidate of several
    others, a long one in containment most of all), and a collision, the only way a count could be off, has odds
    below 1e-9 for two documents of 100,000 words."""
    texts = documents.select_columns(["text"])

    @functools.lru_cache(maxsize=_CACHED_SETS)
    def shingles(index: int) -> np.ndarray:
        words = _shingles(normalize(texts[index]["text"]), shingle_words)
        return np.unique(np.fromiter(map(hash, words), np.int64, len(words)))  # (distinct shingles,)

    return shingles


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """Shingles common to two shingle sets of `_shingle_sets`."""
    return np.intersect1d(a, b, assume_unique=True).size


def _scan(
    signatures: datasets.Dataset,
    documents: datasets.Dataset,
    cfg: DedupConfig,
    report: dict[str, Any],
    shingles: Callable[[int], np.ndarray],
) -> list[int]:
    """Indices of the documents kept by exact and near dedup, in order; counts and example pairs of the removed ones
    go into `report`."""
    ids = documents["id"]

    def similarity(a: int, b: int) -> float:
        shared = _shared(shingles(a), shingles(b))
        return shared / (len(shingles(a)) + len(shingles(b)) - shared)

    # the estimate's standard error is at most 0.5 / sqrt(num_perm): a pair at the threshold is skipped before the
    # exact check with probability < 1e-4
    margin = 4 * 0.5 / cfg.num_perm**0.5
    first_by_hash: dict[str, int] = {}
    lsh = _lsh(cfg.threshold, cfg.num_perm) if cfg.near else None
    kept_minhashes: dict[int, LeanMinHash] = {}
    keep: list[int] = []
    for index, row in enumerate(signatures):
        if cfg.exact and row["exact_hash"] in first_by_hash:
            _removed(report, cfg.examples, "exact", ids[first_by_hash[row["exact_hash"]]], ids[index], 1.0)
            continue
        if (cfg.near or cfg.containment) and not row["minhash"]:
            report["too_short_for_near"] += 1
        if cfg.near and row["minhash"]:
            minhash = LeanMinHash(seed=_SEED, hashvalues=np.asarray(row["minhash"], np.uint32), scheme=_SCHEME)
            exact = functools.partial(similarity, index)
            match = _best_match(minhash, lsh.query(minhash), kept_minhashes, cfg.threshold, exact, margin)
            if match is not None:
                _removed(report, cfg.examples, "near", ids[match[1]], ids[index], match[0])
                continue
            lsh.insert(index, minhash)
            kept_minhashes[index] = minhash
        first_by_hash[row["exact_hash"]] = index
        keep.append(index)
    return keep


def _without_contained(
    keep: list[int],
    signatures: datasets.Dataset,
    ids: list[str],
    cfg: DedupConfig,
    report: dict[str, Any],
    shingles: Callable[[int], np.ndarray],
) -> list[int]:
    """`keep` without the documents contained in a longer kept one (see the module docstring), in order; counts and
    example pairs go into `report`."""
    rows = signatures.select(keep).select_columns(["minhash", "shingles"])
    minhashes = {
        index: LeanMinHash(seed=_SEED, hashvalues=np.asarray(row["minhash"], np.uint32), scheme=_SCHEME)
        for index, row in zip(keep, rows, strict=True)
        if row["minhash"]
    }
    if not minhashes:
        return keep
    sizes = dict(zip(keep, rows["shingles"], strict=True))
    ensemble = MinHashLSHEnsemble(cfg.containment_threshold, cfg.num_perm, weights=_CONTAINMENT_WEIGHTS)
    ensemble.index([(index, minhash, sizes[index]) for index, minhash in minhashes.items()])
    rank = {index: (sizes[index], -index) for index in minhashes}  # longer first; the earlier of two equals
    contained: set[int] = set()
    for index in sorted(minhashes, key=rank.get, reverse=True):
        longer_kept = [
            c for c in ensemble.query(minhashes[index], sizes[index]) if c not in contained and rank[c] > rank[index]
        ]
        likely = [c for c in longer_kept if _may_contain(minhashes[index], minhashes[c], sizes[index], sizes[c], cfg)]
        shared = {c: _shared(shingles(index), shingles(c)) for c in likely}
        # mutual containment is a near-duplicate pair, which `threshold` alone decides
        scored = [
            (n / len(shingles(index)), -c)
            for c, n in shared.items()
            if n / len(shingles(c)) < cfg.containment_threshold
        ]
        best = max((pair for pair in scored if pair[0] >= cfg.containment_threshold), default=None)
        if best is not None:
            contained.add(index)
            _removed(report, cfg.examples, "containment", ids[-best[1]], ids[index], best[0])
    return [index for index in keep if index not in contained]


def _may_contain(query: LeanMinHash, other: LeanMinHash, q: int, x: int, cfg: DedupConfig) -> bool:
    """Whether the MinHash estimate leaves it plausible that a set of size q lies within one of size x for
    `containment_threshold` of it: such a pair has Jaccard at least j = t q / (x + q - t q), and its estimate falls
    4 standard errors below j with probability < 1e-4."""
    t = cfg.containment_threshold
    least = t * q / (x + q - t * q)
    return query.jaccard(other) >= least - 4 * (least * (1 - least) / cfg.num_perm) ** 0.5


def _best_match(
    minhash: LeanMinHash,
    candidates: list[int],
    kept: dict[int, LeanMinHash],
    threshold: float,
    exact: Callable[[int], float] | None = None,
    margin: float = 0.0,
) -> tuple[float, int] | None:
    """(similarity, index) of the most similar candidate at or above `threshold` (the earliest among equals), or
    None. LSH candidates are only likely matches, so each one is checked: those whose estimated Jaccard is at least
    `threshold - margin` are scored by `exact(index)`, their true similarity, when given, else by the estimate."""
    scored = []
    for index in candidates:
        estimate = minhash.jaccard(kept[index])
        if estimate >= threshold - margin:
            scored.append((estimate if exact is None else exact(index), -index))
    best = max((pair for pair in scored if pair[0] >= threshold), default=None)
    return None if best is None else (best[0], -best[1])


def _lsh(threshold: float, num_perm: int) -> MinHashLSH:
    """An LSH index banded for `threshold` (see `bands`)."""
    return MinHashLSH(threshold=threshold, num_perm=num_perm, params=bands(threshold, num_perm))


def _removed(
    report: dict[str, Any], examples: int, kind: str, kept_id: str, removed_id: str, similarity: float
) -> None:
    """Counts one removed duplicate and lists it as an example while fewer than `examples` are listed."""
    report[f"{kind}_duplicates"] += 1
    if len(report["examples"]) < examples:
        pair = {"kept_id": kept_id, "removed_id": removed_id, "kind": kind, "similarity": round(float(similarity), 4)}
        report["examples"].append(pair)


def _check(documents: datasets.Dataset, cfg: DedupConfig, num_proc: int) -> None:
    """Raises on a bad argument before any compute."""
    if not isinstance(documents, datasets.Dataset):
        raise TypeError(f"documents must be a datasets.Dataset, got {type(documents).__name__}")
    missing = {"id", "text"} - set(documents.column_names)
    if missing:
        raise ValueError(f"documents must have columns id and text, missing {sorted(missing)}")
    if not isinstance(cfg, DedupConfig):
        raise TypeError(f"cfg must be a DedupConfig, got {type(cfg).__name__}")
    for name in ("exact", "near", "containment"):
        if not isinstance(getattr(cfg, name), bool):
            raise TypeError(f"dedup.{name} must be a bool, got {getattr(cfg, name)!r}")
    for name in ("threshold", "containment_threshold"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ValueError(f"dedup.{name} must be a number in (0, 1], got {value!r}")
    for name, low in (("shingle_words", 1), ("num_perm", 2), ("examples", 0)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"dedup.{name} must be an int >= {low}, got {value!r}")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be an int >= 1, got {num_proc!r}")
