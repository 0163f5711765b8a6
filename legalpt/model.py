"""The Hugging Face model a run trains: a new decoder built from `ModelConfig`, or a pretrained checkpoint.

Either way the model runs `cfg.attn_implementation` (by default legalpt attention, see `legalpt.hf`) on the
backend `cfg.attention_backend`, and stays a standard transformers model that `save_pretrained` exports.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from legalpt import hf
from legalpt.attention import set_backend
from legalpt.config import ModelConfig

ARCHS = ("llama", "mistral", "qwen2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A causal LM: `cfg.pretrained` loaded, or a new `cfg.arch` decoder sized by `cfg` and `tokenizer`."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}; got {cfg.dtype!r}")
    config = None if cfg.pretrained else hf_config(cfg, tokenizer)
    hf.register()
    set_backend(cfg.attention_backend)
    options = {"attn_implementation": cfg.attn_implementation, "dtype": DTYPES[cfg.dtype]}
    if config is not None:
        return AutoModelForCausalLM.from_config(config, **options)
    model = AutoModelForCausalLM.from_pretrained(cfg.pretrained, **options)
    embedded = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > embedded:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but model.pretrained={cfg.pretrained!r} embeds only {embedded}"
        )
    return model


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
    """Reject architecture fields that transformers would reject later or silently ignore."""
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
