"""Evaluation on held-out documents during training: citation completion and bits per byte at step 0, every
`train.eval_documents_every` steps and at the end, logged with the run's other metrics (metrics.jsonl, trackers) as
eval/citation_exact, eval/citation_well_formed, eval/citation_fabricated (means over the items) and
eval/bits_per_byte.

These are legalpt-eval's citation and perplexity tasks on a small fixed set, through legalpt.eval's own functions:
the documents are `heldout_documents` of the run's data (at most eval.max_documents); `train.eval_citations` items are
drawn from them by `build_citation_items` (eval.citations.prompt_tokens, eval.seed), continued greedily by `generate`
(eval.generation) and scored by `score_citation` against those documents' citations; bits per byte is
`document_perplexity` of the first `train.eval_documents` of them (eval.perplexity_context, eval.perplexity_stride,
eval.batch_size). At the last step the numbers are those legalpt-eval reports for the export with the same settings.
The set is built once per process, seeded, so a resume with the same settings scores the same items; it is written to
<run_dir>/live_eval_set.jsonl in legalpt-eval's eval-set format (`eval.eval_set=` reuses it).

Under DDP, ranks share items and documents round-robin and sum their totals: every rank reaches the one reduce,
whatever its share, and each runs its unwrapped model (a DDP forward would wait for the others). Under FSDP2 every
forward gathers parameters from all ranks, so every rank scores the whole set, each forward in step with the others:
the same generation batches, decoded until every rank's batch is done (`generate(synced=True)`), and the same
perplexity windows. Without gradients, under training's autocast; generation and scoring switch the model to eval mode
and back. Training's random states are restored afterwards, so turning this on changes no training step.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from legalpt.config import Config
from legalpt.eval import citations
from legalpt.eval.generate import generate
from legalpt.eval.perplexity import document_perplexity
from legalpt.eval.run import EvalSet, heldout_documents

log = logging.getLogger(__name__)

LIVE_SET = "live_eval_set.jsonl"  # the run folder's live evaluation items
LOGGED = ("exact", "well_formed", "fabricated")  # citation metrics logged as eval/citation_<name>; never NaN


@contextmanager
def kept_random_state(device: torch.device) -> Iterator[None]:
    """Give training back Python's, NumPy's and torch's random states (CPU and `device`) as they were."""
    python, numpy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy)


@dataclasses.dataclass
class LiveEval:
    """The fixed set scored during training, and how to score it."""

    cfg: Config
    tokenizer: PreTrainedTokenizerBase
    items: list[citations.CitationItem]
    index: citations.CitationIndex  # the citations of every live document: what counts as fabricated
    documents: list[dict]  # scored whole for bits per byte

    @classmethod
    def start(
        cls, cfg: Config, tokenizer: PreTrainedTokenizerBase, accelerator: Accelerator, run_dir: Path
    ) -> LiveEval | None:
        """The live evaluation of this run, its items written to the run folder; None when it is off."""
        tc = cfg.train
        if not (tc.eval_citations or tc.eval_documents):
            return None
        # main process first: reading the corpus fills the datasets cache, which ranks must not write at once
        with kept_random_state(accelerator.device), accelerator.main_process_first():
            documents, _ = heldout_documents(cfg.data, cfg.eval.max_documents)
            items, stats = [], {}
            if tc.eval_citations:
                prompt_tokens, seed = cfg.eval.citations.prompt_tokens, cfg.eval.seed
                items, stats = citations.build_citation_items(documents, tokenizer, prompt_tokens, tc.eval_citations,
                                                              seed)  # fmt: skip
        if len(items) < tc.eval_citations:
            log.warning("train.eval_citations=%d: the held-out documents hold %d citation items; %s", tc.eval_citations,
                        len(items), "scoring those" if items else "no citation metrics")  # fmt: skip
        index = citations.CitationIndex.from_documents(documents) if items else citations.CitationIndex()
        live = cls(cfg, tokenizer, items, index, documents[: tc.eval_documents])
        if accelerator.is_main_process:
            EvalSet(items, [], {"citations": stats}).save(run_dir / LIVE_SET)
        log.info("live evaluation every %d steps: %d citation items, %d documents for bits per byte → %s",
                 live.every, len(items), len(live.documents), run_dir / LIVE_SET)  # fmt: skip
        return live

    @property
    def every(self) -> int:
        """Steps between evaluations."""
        return self.cfg.train.eval_documents_every or self.cfg.train.eval_every

    def due(self, step: int) -> bool:
        """Whether `step` is evaluated: step 0, every `every` steps and the last step."""
        return step % self.every == 0 or step == self.cfg.train.steps

    def evaluate(self, model: torch.nn.Module, accelerator: Accelerator) -> dict[str, float]:
        """The metrics of `model` (unwrapped) on the set, the same on every rank."""
        sharded = self.cfg.train.distributed == "fsdp2"
        rank, world = (0, 1) if sharded else (accelerator.process_index, accelerator.num_processes)
        with kept_random_state(accelerator.device), torch.no_grad(), accelerator.autocast():
            synced = sharded and accelerator.num_processes > 1
            citation_sums = self._citation_sums(model, self.items[rank::world], synced)
            totals = [*citation_sums, *self._byte_sums(model, rank, world)]
        totals = torch.tensor(totals, dtype=torch.float64, device=accelerator.device)
        if world > 1:
            totals = accelerator.reduce(totals, "sum")
        sums = dict(zip((*LOGGED, "nll", "bytes"), totals.tolist(), strict=True))
        values = {}
        if self.items:
            values = {f"eval/citation_{name}": sums[name] / len(self.items) for name in LOGGED}
        if self.documents:
            values["eval/bits_per_byte"] = sums["nll"] / math.log(2) / sums["bytes"]
        log.info("live evaluation: %s", ", ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in values.items()))
        return values

    def _citation_sums(self, model: torch.nn.Module, items: list[citations.CitationItem], synced: bool) -> list[float]:
        """Sums over `items` of each LOGGED metric of greedy continuations (zeros for no items); `synced`: decoded in
        step with the other ranks."""
        e = self.cfg.eval
        greedy = dataclasses.replace(e.generation, do_sample=False)
        prompts = [item.prompt for item in items]
        texts = generate(model, self.tokenizer, prompts, greedy, e.seed, "live citations", synced=synced)
        scores = [citations.score_citation(item, text, self.index) for item, text in zip(items, texts, strict=True)]
        return [sum(score[name] for score in scores) for name in LOGGED]

    def _byte_sums(self, model: torch.nn.Module, rank: int, world: int) -> list[float]:
        """(nll in nats, UTF-8 bytes scored) of this rank's share of the documents."""
        documents = self.documents[rank::world]
        if not documents:
            return [0.0, 0.0]
        e = self.cfg.eval
        report = document_perplexity(model, self.tokenizer, documents, e.perplexity_context, e.perplexity_stride,
                                     e.batch_size, samples=0)  # fmt: skip
        rows = report["per_document"]
        return [sum(row["nll"] for row in rows), sum(row["bytes"] for row in rows)]
