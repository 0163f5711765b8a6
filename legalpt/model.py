"""The Hugging Face model a run trains: a new decoder built from `ModelConfig`, or a pretrained checkpoint.

Either way the model runs `cfg.attn_implementation` (by default legalpt attention, see `legalpt.hf`) on the
backend `cfg.attention_backend`, and stays a standard transformers model that `save_pretrained` exports. A checkpoint
whose tokenizer was extended with new tokens gets an embedding row (and LM-head row) for each (`extend_embeddings`).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from legalpt import hf
from legalpt.attention import set_backend
from legalpt.config import ARCHS, DTYPES, ModelConfig


def build_model(
    cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, base_tokenizer: PreTrainedTokenizerBase | None = None
) -> PreTrainedModel:
    """A causal LM: `cfg.pretrained` loaded, or a new `cfg.arch` decoder sized by `cfg` and `tokenizer`.

    `base_tokenizer` is the checkpoint's tokenizer when `tokenizer` extends it: the loaded model then gets rows for
    the added tokens (a new model is built with the full vocabulary anyway)."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}; got {cfg.dtype!r}")
    config = None if cfg.pretrained else hf_config(cfg, tokenizer)
    hf.register()
    set_backend(cfg.attention_backend)
    # DTYPES are the names of torch dtypes
    options = {"attn_implementation": cfg.attn_implementation, "dtype": getattr(torch, cfg.dtype)}
    if config is not None:
        return AutoModelForCausalLM.from_config(config, **options)
    model = AutoModelForCausalLM.from_pretrained(cfg.pretrained, **options)
    if base_tokenizer is not None:
        extend_embeddings(model, base_tokenizer, tokenizer)
    embedded = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > embedded:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but model.pretrained={cfg.pretrained!r} embeds only {embedded}"
        )
    return model


@torch.no_grad()
def extend_embeddings(
    model: PreTrainedModel, old_tokenizer: PreTrainedTokenizerBase, new_tokenizer: PreTrainedTokenizerBase
) -> None:
    """Give `model`, trained with `old_tokenizer`, rows for the tokens `new_tokenizer` appends to it: each new input
    embedding (and LM-head row, when not tied) is the mean of the rows of the pieces `old_tokenizer` splits the new
    token's text into, so the model starts from what it already read for that text."""
    old_vocab, new_vocab = old_tokenizer.get_vocab(), new_tokenizer.get_vocab()
    if any(new_vocab.get(token) != i for token, i in old_vocab.items()):
        raise ValueError("new_tokenizer: expected the tokens of old_tokenizer, with their ids, and tokens added after")
    new_ids = sorted(i for i in new_vocab.values() if i >= len(old_tokenizer))  # (n_new,)
    pieces = [old_tokenizer(new_tokenizer.decode([i]), add_special_tokens=False)["input_ids"] for i in new_ids]
    if len(new_tokenizer) > model.get_input_embeddings().num_embeddings:
        # mean_resizing=False: the rows are set below; the mean of all rows would be computed for nothing.
        model.resize_token_embeddings(len(new_tokenizer), mean_resizing=False)
    tables = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight is not tables[0]:
        tables.append(output.weight)
    for table in tables:  # (vocab, hidden)
        for i, ids in zip(new_ids, pieces, strict=True):
            table[i] = table[ids].float().mean(0).to(table.dtype)


def hf_config(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedConfig:
    """The transformers config of a new `cfg.arch` model; vocabulary and special tokens come from `tokenizer`."""
    _check_architecture(cfg)
    window = cfg.sliding_window
    per_arch = {
        "llama": {},
        "mistral": {"sliding_window": window},
        # Qwen2 slides only in layers >= max_window_layers: 0 makes every layer slide, as in Mistral.
        "qwen2": {"use_sliding_window": window is not None, "sliding_window": window, "max_window_layers": 0},
    }
    return AutoConfig.for_model(
        cfg.arch,
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **per_arch[cfg.arch],
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters, each shared tensor (tied embeddings) counted once."""
    return sum(p.numel() for p in model.parameters())


def _check_architecture(cfg: ModelConfig) -> None:
    """Reject architecture fields that transformers would reject later or silently ignore: `to_config` checks them
    too, but `build_model` also serves a ModelConfig that never went through it."""
    if cfg.arch not in ARCHS:
        raise ValueError(f"model.arch must be one of {', '.join(ARCHS)}; got {cfg.arch!r}")
    sizes = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_position_embeddings")
    for name in sizes:
        if getattr(cfg, name) < 1:
            raise ValueError(f"model.{name} must be >= 1; got {getattr(cfg, name)}")
    for whole, part in (("hidden_size", "num_heads"), ("num_heads", "num_kv_heads")):
        if getattr(cfg, whole) % getattr(cfg, part):
            raise ValueError(f"model.{whole} must be a multiple of model.{part}; got {getattr(cfg, whole)}")
    if cfg.sliding_window is not None:
        if cfg.arch == "llama":
            raise ValueError("model.sliding_window needs model.arch mistral or qwen2 (llama has no sliding window)")
        if cfg.sliding_window < 1:
            raise ValueError(f"model.sliding_window must be None or >= 1; got {cfg.sliding_window}")
