"""Packed documents stay apart under every attention implementation, through the model as the trainer calls it.

A packed batch is built as training builds it (`pack_documents`, then `collate_packed`) and run through `build_model`'s
model with the trainer's keyword arguments. Changing the tokens of one document must leave the logits of every other
token exactly as they were: legalpt attention splits rows at `cu_seq_lens`, sdpa and eager at restarting
`position_ids`, which transformers reads only when the forward keeps no cache.
"""

import pytest
import torch
from test_model import make_tokenizer

from legalpt.data.pack import IGNORE_INDEX, collate_packed, pack_documents
from legalpt.model import build_model

VOCAB = 300
EOS, PAD = 2, 3  # make_tokenizer's </s> and <pad>
SEQ_LEN = 20
# With eos: 7 + 10 + 13 + 6 tokens. Row 0 holds documents 0, 1 and the start of 2; row 1 the rest of 2, document 3
# and 4 pads. Document 1 sits right after document 0 in its row.
LENGTHS = [6, 9, 12, 5]
IMPLEMENTATIONS = ["legalpt", "sdpa", "eager"]


def packed_batch(documents: list[list[int]]) -> dict:
    return collate_packed(list(pack_documents(documents, SEQ_LEN, EOS, PAD)))


def trainer_logits(model, batch: dict, **kwargs) -> torch.Tensor:
    """Logits of the forward `legalpt.train.trainer.train_step` makes, (B*S, V)."""
    targets = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
    return model(**batch, num_items_in_batch=targets, **kwargs).logits.detach()[0]


def document_zero_changed(rng) -> tuple[dict, dict, torch.Tensor]:
    """Two packed batches that differ only in document 0's tokens, and the (B*S,) bool mask of document 0's slots."""
    documents = [[rng.randrange(4, VOCAB) for _ in range(n)] for n in LENGTHS]
    changed = [[rng.randrange(4, VOCAB) for _ in range(LENGTHS[0])], *documents[1:]]
    first, second = packed_batch(documents), packed_batch(changed)
    in_document_zero = first["input_ids"][0] != second["input_ids"][0]
    assert in_document_zero[: LENGTHS[0]].any() and not in_document_zero[LENGTHS[0] + 1 :].any()
    return first, second, in_document_zero


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize(("arch", "window"), [("llama", None), ("mistral", 8)])
def test_changing_one_document_leaves_the_others_logits_unchanged(implementation, arch, window, rng, tiny_model_config):
    cfg = tiny_model_config(arch=arch, sliding_window=window, attn_implementation=implementation)
    model = build_model(cfg, make_tokenizer(VOCAB)).train()
    first, second, in_document_zero = document_zero_changed(rng)
    before, after = trainer_logits(model, first), trainer_logits(model, second)
    others = ~in_document_zero
    others[LENGTHS[0]] = False  # document 0's eos: same token, but it reads document 0
    torch.testing.assert_close(after[others], before[others], atol=1e-6, rtol=0)
    assert not torch.allclose(after[in_document_zero], before[in_document_zero], atol=1e-3)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_cache_would_let_sdpa_and_eager_attend_across_documents(implementation, rng, tiny_model_config):
    """What the test above guards against: transformers reads no document boundaries when a forward builds a cache,
    so document 1 then reads document 0."""
    model = build_model(tiny_model_config(attn_implementation=implementation), make_tokenizer(VOCAB)).train()
    first, second, _ = document_zero_changed(rng)
    before, after = trainer_logits(model, first, use_cache=True), trainer_logits(model, second, use_cache=True)
    document_one = slice(LENGTHS[0] + 1, LENGTHS[0] + 1 + LENGTHS[1] + 1)
    assert not torch.allclose(after[document_one], before[document_one], atol=1e-3)
