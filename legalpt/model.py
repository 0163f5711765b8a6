"""The Hugging Face model a run trains: a new decoder built from `ModelConfig`, or a pretrained checkpoint.

Either way the model runs `cfg.attn_implementation` (by default legalpt attention, see `legalpt.hf`) on the
backend `cfg.attention_backend`, and stays a standard transformers model that `save_pretrained` exports. A checkpoint
whose tokenizer was extended with new tokens gets an embedding row (and LM-head row) for each (`extend_embeddings`).

Context length: `cfg.rope_scaling` maps onto transformers' `rope_parameters` (`scaled_rope`), for a new model and
over a checkpoint's own; `max_positions` says how long a sequence the model covers, so that `Config.validate` can
refuse a longer `data.seq_len` before any data is prepared.

Packed documents: a forward keeps no KV cache unless its caller asks for one (`generate` does). transformers reads
document boundaries from restarting `position_ids` only when no cache is passed, so this keeps packed documents apart
under sdpa and eager too, and spares training a DynamicCache per step.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from legalpt import hf
from legalpt.attention import set_backend
from legalpt.config import ARCHS, DTYPES, ModelConfig, RopeScalingConfig


def build_model(
    cfg: ModelConfig,
    tokenizer: PreTrainedTokenizerBase,
    base_tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | str | None = None,
) -> PreTrainedModel:
    """A causal LM: `cfg.pretrained` loaded, or a new `cfg.arch` decoder sized by `cfg` and `tokenizer`.

    `base_tokenizer` is the checkpoint's tokenizer when `tokenizer` extends it: the loaded model then gets rows for
    the added tokens (a new model is built with the full vocabulary anyway). `device`: where a new model's weights
    are created and initialised (None: torch's default device, the CPU unless a `with torch.device(...)` says), so
    that a GPU run neither initialises a preset's billions of values on the CPU nor holds them in host memory; a
    checkpoint loads on the CPU."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}; got {cfg.dtype!r}")
    config = None if cfg.pretrained else hf_config(cfg, tokenizer)
    hf.register()
    set_backend(cfg.attention_backend)
    # DTYPES are the names of torch dtypes
    options = {"attn_implementation": cfg.attn_implementation, "dtype": getattr(torch, cfg.dtype)}
    if config is not None:
        with contextlib.nullcontext() if device is None else torch.device(device):
            return _without_default_cache(AutoModelForCausalLM.from_config(config, **options))
    config = AutoConfig.from_pretrained(cfg.pretrained)
    if cfg.rope_scaling.type != "none":
        config.rope_parameters, config.max_position_embeddings = scaled_rope(
            cfg.rope_scaling, dict(config.rope_parameters), config.max_position_embeddings
        )
    model = _without_default_cache(AutoModelForCausalLM.from_pretrained(cfg.pretrained, config=config, **options))
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
    default_rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    rope, max_position_embeddings = scaled_rope(cfg.rope_scaling, default_rope, cfg.max_position_embeddings)
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
        max_position_embeddings=max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **per_arch[cfg.arch],
    )


def scaled_rope(scaling: RopeScalingConfig, rope: dict, max_positions: int) -> tuple[dict, int]:
    """`rope` (transformers' `rope_parameters` of a model trained at `max_positions`) with `scaling` applied, and the
    scaled model's `max_position_embeddings`; unchanged for scaling type none.

    The base frequency (and a partial rotary factor) stay the model's; the rest is replaced. The model then covers
    factor * original positions (`covered_positions`), original being the trained context unless given."""
    if scaling.type == "none":
        return rope, max_positions
    original = scaling.original_max_position_embeddings or max_positions
    kept = {name: rope[name] for name in ("rope_theta", "partial_rotary_factor") if name in rope}
    params = {"rope_type": scaling.type, **kept, "factor": float(scaling.factor)}
    if scaling.type in ("llama3", "yarn"):
        params["original_max_position_embeddings"] = original
    if scaling.type == "llama3":
        params |= {"low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor}
    if scaling.type == "yarn":
        params |= {"beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow}
        if scaling.attention_factor is not None:
            params["attention_factor"] = float(scaling.attention_factor)
    if scaling.type == "dynamic":
        # transformers stretches dynamic NTK once a sequence passes max_position_embeddings: the trained context
        return params, original
    return params, max(max_positions, round(scaling.factor * original))


def covered_positions(rope: dict, max_position_embeddings: int) -> int:
    """The longest sequence a model of these transformers settings is set up for: its max_position_embeddings, or
    the factor times its trained context where dynamic NTK, llama3 or YaRN scaling stretch RoPE past that."""
    kind, factor = rope.get("rope_type", "default"), rope.get("factor", 1.0)
    if kind == "dynamic":
        return round(factor * max_position_embeddings)
    if kind in ("llama3", "yarn"):
        original = rope.get("original_max_position_embeddings", max_position_embeddings)
        return max(max_position_embeddings, round(factor * original))
    return max_position_embeddings


def max_positions(cfg: ModelConfig) -> tuple[int, str] | None:
    """How long a sequence the model of `cfg` covers, and a note saying where that comes from and how to go further;
    None when a checkpoint's config cannot be read (its load reports why). Of a checkpoint, config.json alone is read
    (no weights)."""
    scaling = cfg.rope_scaling
    if cfg.pretrained:
        try:
            config = AutoConfig.from_pretrained(cfg.pretrained)
        except OSError:
            return None
        rope, positions = dict(config.rope_parameters or {}), config.max_position_embeddings
        source = f"max_position_embeddings of model.pretrained={cfg.pretrained!r}"
    else:
        rope, positions = {"rope_type": "default", "rope_theta": cfg.rope_theta}, cfg.max_position_embeddings
        source = "model.max_position_embeddings"
    covered = covered_positions(*scaled_rope(scaling, rope, positions))
    if scaling.type == "none":
        return covered, f"{source}: stretch RoPE with model.rope_scaling"
    if scaling.original_max_position_embeddings:
        source = "model.rope_scaling.original_max_position_embeddings"
    original = scaling.original_max_position_embeddings or positions
    return covered, f"model.rope_scaling.factor {scaling.factor} x {original}, the trained context ({source})"


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters, each shared tensor (tied embeddings) counted once."""
    return sum(p.numel() for p in model.parameters())


def _without_default_cache(model: PreTrainedModel) -> PreTrainedModel:
    """Make `use_cache` default to False in `model`'s forward, where transformers defaults it to config.use_cache.

    Only a caller that asks for a cache gets one (`generate` always passes use_cache): a training or scoring forward
    then builds no DynamicCache, and transformers splits packed rows at restarting position_ids, which it does only
    without a cache, so sdpa and eager keep packed documents apart. A hook, not config.use_cache=False: the
    exported config.json and generation config keep use_cache true, so the checkpoint generates with a cache."""

    def no_cache_unless_asked(module, args, kwargs):
        if kwargs.get("use_cache") is None:
            kwargs["use_cache"] = False
        return args, kwargs

    # The decoder stack, where transformers resolves use_cache; the causal LM passes it through as given.
    model.get_decoder().register_forward_pre_hook(no_cache_unless_asked, with_kwargs=True)
    return model


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
