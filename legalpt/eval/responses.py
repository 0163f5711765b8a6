"""Held-out response loss of fine-tuning examples (data.format=sft), the `response_loss` task of `legalpt-eval`.

The examples are read and split as fine-tuning reads and splits them (`legalpt.data.sft.load_chats`, the held-out
split of `legalpt.data.pipeline.split_documents`), or all of them with eval.documents=all; an example a checkpoint
was trained on (its run's training-documents manifest) is left out and counted. Each checkpoint renders, masks and
packs them with its own tokenizer exactly as fine-tuning does (`legalpt.data.sft.encode_chats`,
`legalpt.data.pack.pack_example_dataset`), and scores them with the trainer's held-out loss
(`legalpt.eval.perplexity.heldout_loss`): next-token cross-entropy summed over response tokens only (prompts, the
first token of each example and padding carry no label) and divided by their number.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import datasets
import torch
from transformers import PreTrainedTokenizerFast

from legalpt.config import DataConfig
from legalpt.data.manifest import TrainingDocuments
from legalpt.data.pack import collate_packed, pack_example_dataset
from legalpt.data.pipeline import split_documents
from legalpt.data.sft import encode_chats, load_chats, resolve_template
from legalpt.eval.perplexity import heldout_loss


def heldout_examples(
    cfg: DataConfig, max_examples: int, everything: bool = False, training: TrainingDocuments | None = None
) -> tuple[datasets.Dataset, dict]:
    """The chats to score (id, messages, text): the held-out split of `cfg`'s examples, or with `everything` all of
    them; at most `max_examples` (0 = all), none of `training`. Also the report's data section: how many, the
    records skipped while reading (by reason) and the examples left out as trained on."""
    training = training or TrainingDocuments()
    chats, skipped, read = load_chats(cfg)
    candidates = chats if everything else split_documents(chats, cfg.heldout_fraction, cfg.seed)[1]
    kept = [i for i, text in enumerate(candidates["text"]) if not training.trained(text)]
    excluded = len(candidates) - len(kept)
    if not kept:
        where = f"data.paths {list(cfg.paths)}" if cfg.paths or cfg.sources else "the demo examples"
        raise ValueError(
            f"data: no fine-tuning example to score in {where} ({read} read, {skipped}; {excluded} trained on); "
            + ("use examples the checkpoint never saw" if excluded else "use eval.documents=all or more examples")
        )
    stats = {"unit": "examples", "documents": len(kept[: max_examples or None]), "read": read,
             "scope": "all" if everything else "heldout", "skipped": str(skipped)}  # fmt: skip
    return candidates.select(kept[: max_examples or None]), {
        **stats,
        "excluded_training": excluded,
        "manifests": training.paths,
    }


def response_loss(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, examples: datasets.Dataset, cfg: DataConfig,
    batch_size: int,
) -> dict:  # fmt: skip
    """Loss and perplexity over the response tokens of `examples` (from `heldout_examples`), packed in rows of
    data.seq_len, `batch_size` rows per forward pass; with the examples scored and those that could not be (by
    reason: longer than data.seq_len, unrenderable)."""
    template = resolve_template(cfg.sft.template, tokenizer, cfg.bos)
    skipped: dict[str, dict] = {}
    # A folder of this call's own: the encoded examples and rows are written there, and nothing is reused.
    with tempfile.TemporaryDirectory(prefix="legalpt-responses-") as work:
        cache = (Path(work) / "examples.arrow", f"{examples._fingerprint}-response-loss")
        encoded = encode_chats(examples, tokenizer, template, cfg, cache, skipped)
        if encoded.num_rows == 0:
            raise ValueError(f"data.seq_len: none of the {examples.num_rows} examples could be scored ({skipped})")
        rows, _ = pack_example_dataset(encoded, cfg.seq_len, tokenizer.pad_token_id, work)
        loss = heldout_loss(model, _batches(rows, batch_size, next(model.parameters()).device))
    return {
        **loss,
        "examples": encoded.num_rows,
        "template": template,
        "skipped": {reason: place["count"] for reason, place in skipped.items()},
    }


def _batches(rows: datasets.Dataset, batch_size: int, device: torch.device) -> Iterator[dict]:
    """Packed batches of `batch_size` rows (the last one fewer) on `device`."""
    for start in range(0, rows.num_rows, batch_size):
        batch = collate_packed([rows[i] for i in range(start, min(start + batch_size, rows.num_rows))])
        yield {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in batch.items()}
