"""Batched generation with a KV cache: prompts in, the new text of each out, in the order of the prompts.

`generate` returns the texts; `generate_with_stats` also returns per-prompt token counts, left truncation and the
wall time (`GenerationResult`), for throughput figures and for reports that must say what was cut.

Decoding path: transformers' `model.generate` with its dynamic KV cache; the attention is whatever the model was built
with. With `attn_implementation="legalpt"` both phases run legalpt attention through `legalpt.hf`: the prompt
(prefill) of a left-padded batch calls `flash_attn_varlen_func` on the real tokens only, one document per row, and
every decode step calls `flash_attn_varlen_func` again with one query per row over that row's cached keys
(`flash_attn_func` in both phases when no row of the batch is padded). tests/eval/test_generate.py counts these calls.

Conventions:
- Prompts are encoded as the data pipeline encodes documents, without special tokens (no bos), and left-padded with
  the tokenizer's pad token (eos when it has none), so every row's last prompt token sits next to its first new one.
- A prompt longer than `max_position_embeddings - max_new_tokens` tokens keeps its last tokens (the text nearest to
  the continuation); the dropped tokens are counted per prompt in `GenerationResult.truncated` and logged.
- A row stops at the tokenizer's eos (counted in `new_tokens`, not part of the text) unless `min_new_tokens` holds
  it back; special tokens are skipped when decoding.
- Prompts run longest first in batches of `cfg.batch_size`, so rows of a batch have similar lengths (little padding)
  and a batch that does not fit in memory fails first.
- Greedy by default. Sampling (`cfg.do_sample`) uses `cfg.temperature` and `cfg.top_p` only (transformers' default
  top-k of 50 is switched off) and draws from torch's generators seeded with `seed` inside `torch.random.fork_rng`:
  the same call (same prompts and batch size) gives the same texts, and the caller's random state is untouched.
  Settings outside `GenerationConfig` (repetition penalty, ...) keep the model's own `generation_config` values.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import transformers
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from legalpt.config import GenerationConfig
from legalpt.runtime import on_local_main_process

log = logging.getLogger(__name__)


@dataclass
class GenerationResult:
    """What one `generate_with_stats` call produced; the lists follow the order of the prompts."""

    texts: list[str]  # newly generated text of each prompt, special tokens skipped
    prompt_tokens: list[int]  # prompt tokens given to the model, after truncation
    new_tokens: list[int]  # tokens generated, the stopping eos included
    truncated: list[int]  # prompt tokens dropped from the left to leave room for max_new_tokens
    seconds: float  # wall time of the call, encoding and decoding included


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cfg: GenerationConfig,
    seed: int = 0,
    desc: str = "generate",
    min_new_tokens: int = 0,
    synced: bool = False,
) -> list[str]:
    """The new text generated after each prompt, in the order of `prompts` (see `generate_with_stats`)."""
    return generate_with_stats(model, tokenizer, prompts, cfg, seed, desc, min_new_tokens, synced).texts


def generate_with_stats(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    cfg: GenerationConfig,
    seed: int = 0,
    desc: str = "generate",
    min_new_tokens: int = 0,
    synced: bool = False,
) -> GenerationResult:
    """Continue each prompt by up to `cfg.max_new_tokens` tokens (at least `min_new_tokens`: eos is held back until
    then); `desc` labels the progress bar, which shows prompts/s and new tokens/s. `synced`: every process of the
    default group calls this with as many batches, and each batch keeps decoding until every process's is done
    (transformers' `synced_gpus`), as a model sharded by FSDP needs: each of its forwards gathers from all ranks."""
    _check_arguments(prompts, cfg, seed, min_new_tokens)
    if not prompts:
        return GenerationResult([], [], [], [], 0.0)
    start = time.perf_counter()
    ids, truncated = _encode(tokenizer, prompts, _prompt_limit(model, cfg))
    if sum(truncated):
        log.warning(
            "%s: %d of %d prompts exceeded the context and lost %d tokens from the left",
            desc, sum(n > 0 for n in truncated), len(prompts), sum(truncated),
        )  # fmt: skip
    options = _options(cfg, tokenizer, min_new_tokens)
    new: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    produced, loop_start = 0, time.perf_counter()
    progress = tqdm(total=len(prompts), desc=desc, unit="prompt", disable=not on_local_main_process())
    with _seeded(seed, model.device), _eval_mode(model), progress as bar:
        for first in range(0, len(order), cfg.batch_size):
            batch = order[first : first + cfg.batch_size]
            rows = _generate_batch(model, [ids[i] for i in batch], options, synced)
            for i, row in zip(batch, rows, strict=True):
                new[i] = row
                produced += len(row)
            bar.update(len(batch))
            bar.set_postfix(new_tokens_per_s=f"{produced / (time.perf_counter() - loop_start):.1f}")
    texts = tokenizer.batch_decode(new, skip_special_tokens=True)
    seconds = time.perf_counter() - start
    return GenerationResult(texts, [len(x) for x in ids], [len(x) for x in new], truncated, seconds)


def _check_arguments(prompts: list[str], cfg: GenerationConfig, seed: int, min_new_tokens: int) -> None:
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise TypeError(f"prompts: expected a list of str, got {type(prompts).__name__}")
    for name in ("max_new_tokens", "batch_size"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"generation.{name} must be >= 1; got {getattr(cfg, name)}")
    if cfg.do_sample and not cfg.temperature > 0:
        raise ValueError(f"generation.temperature must be > 0 when sampling; got {cfg.temperature}")
    if cfg.do_sample and not 0 < cfg.top_p <= 1:
        raise ValueError(f"generation.top_p must be in (0, 1]; got {cfg.top_p}")
    if not 0 <= min_new_tokens <= cfg.max_new_tokens:
        raise ValueError(
            f"min_new_tokens must be in [0, generation.max_new_tokens={cfg.max_new_tokens}]; got {min_new_tokens}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")


def _prompt_limit(model: PreTrainedModel, cfg: GenerationConfig) -> int | None:
    """The longest prompt that leaves room for `max_new_tokens` in the model's context (None: no stated context)."""
    context = getattr(model.config, "max_position_embeddings", None)
    if context is None:
        return None
    if context <= cfg.max_new_tokens:
        raise ValueError(
            f"generation.max_new_tokens must be < the model's max_position_embeddings={context} to leave room for a "
            f"prompt; got {cfg.max_new_tokens}"
        )
    return context - cfg.max_new_tokens


def _encode(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], limit: int | None
) -> tuple[list[list[int]], list[int]]:
    """Token ids of each prompt, cut to its last `limit` tokens, and how many tokens each lost."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    for i, row in enumerate(ids):
        if not row:
            raise ValueError(f"prompts[{i}]: expected text that encodes to at least one token, got {prompts[i]!r}")
    truncated = [0 if limit is None else max(0, len(row) - limit) for row in ids]
    return [row[cut:] for row, cut in zip(ids, truncated, strict=True)], truncated


def _options(
    cfg: GenerationConfig, tokenizer: PreTrainedTokenizerBase, min_new_tokens: int
) -> transformers.GenerationConfig:
    """transformers' settings for `cfg`; the tokenizer, not the checkpoint, decides eos and padding."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if pad is None:
        raise ValueError("tokenizer: expected a pad or an eos token to pad batches with, found neither")
    sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0} if cfg.do_sample else {}
    return transformers.GenerationConfig(
        max_new_tokens=cfg.max_new_tokens,
        min_new_tokens=min_new_tokens,
        do_sample=cfg.do_sample,
        eos_token_id=eos,
        pad_token_id=pad,
        **sampling,
    )


def _generate_batch(
    model: PreTrainedModel, rows: list[list[int]], options: transformers.GenerationConfig, synced: bool
) -> list[list[int]]:
    """The new tokens of each row, each cut after its first eos."""
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), options.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):  # left padding
        input_ids[r, width - len(row) :] = torch.tensor(row)
        attention_mask[r, width - len(row) :] = 1
    out = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        generation_config=options,
        synced_gpus=synced,
    )
    return [_until_eos(row, options.eos_token_id) for row in out[:, width:].tolist()]


def _until_eos(tokens: list[int], eos: int | None) -> list[int]:
    """`tokens` up to and including the first eos: what follows is the padding of a finished row."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's generators for sampling and give the caller its random state back afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """No dropout while generating; the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
