"""Typed configuration for every legalpt entry point: the schema, its checks, and composition.

The dataclasses here are the schema; the YAML files in `conf/` only choose values. They are registered with
Hydra's ConfigStore as `legalpt_schema`, so an unknown key or a value of the wrong type fails at composition time
with the key's full name. Ranges and choices are checked by `Config.validate`, which `to_config` runs, so every entry
point checks the whole config before it builds anything or touches data: a bad value raises `ConfigError`, whose
message starts with the value's full key (`model.attention_backend: expected one of ..., got 'fa4'`).

The choices of the enum fields (`ARCHS`, `DTYPES`, ...) are defined here, and the modules that act on them, which
import torch or transformers, take them from here; document kinds are defined beside `guess_kind` in
`legalpt.data.kinds`, which imports nothing heavy. So this module imports only Hydra, OmegaConf and that module; the
two fields whose choices live in heavier registries (legalpt's attention backends, transformers' attention functions)
import them when checked, after every other field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from legalpt.data.kinds import KINDS  # data.sources.<name>.kind

# The YAML groups: conf/ of a source checkout, else the copy an installed package carries (setup.py)
_CHECKOUT_CONF = Path(__file__).resolve().parents[1] / "conf"
CONF_DIR = _CHECKOUT_CONF if _CHECKOUT_CONF.is_dir() else Path(__file__).resolve().parent / "_conf"

# Choices of the enum fields: the one definition of each, imported by the modules that act on them
ARCHS = ("llama", "mistral", "qwen2")  # model.arch: the decoders legalpt.model builds
DTYPES = ("float32", "bfloat16", "float16")  # model.dtype: names of torch dtypes
MIXED_PRECISIONS = ("auto", "bf16", "fp16", "no")  # train.mixed_precision (legalpt.runtime maps auto)
# eval.tasks, in report order (legalpt.eval); response_loss = held-out fine-tuning examples (legalpt.eval.responses);
# harness = lm-evaluation-harness tasks (legalpt.eval.harness)
EVAL_TASKS = ("perplexity", "response_loss", "citations", "citation_set", "choice", "harness")
CHOICE_FORMATS = ("auto", "casehold", "legalbench")  # eval.choice_format (columns of each: legalpt.eval.choice)
EVAL_DOCUMENTS = ("heldout", "all")  # eval.documents: the held-out split | every document (legalpt.eval.run)
LOGGERS = ("wandb", "none")  # logger (legalpt.train.tracking)
DISTRIBUTED = ("ddp", "fsdp2")  # train.distributed (legalpt.train.distributed)
PRECISIONS = ("autocast", "bf16-fsdp")  # train.precision (legalpt.train.distributed)
LOSS_IMPLS = ("plain", "chunked", "fused")  # train.loss_impl (legalpt.train.loss)
# train.activation_checkpointing (legalpt.train.activations)
ACTIVATION_CHECKPOINTING = ("none", "full", "selective", "attention")
RECOMPUTED_LAYERS = ("full", "selective")  # the modes that recompute whole layers, where train.save_attention applies
# train.compile_mode: torch.compile's modes without CUDA graphs, which record a graph per batch shape, and packed
# batches change shape every step (legalpt.train.compile)
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
ROPE_SCALINGS = ("none", "linear", "dynamic", "llama3", "yarn")  # model.rope_scaling.type (transformers' rope_type)
DATA_FORMATS = ("text", "sft")  # data.format: documents to pretrain on | examples to fine-tune on (legalpt.data.sft)
SFT_TEMPLATES = ("auto", "chat", "plain")  # data.sft.template (legalpt.data.sft)
LORA_EXPORTS = ("merged", "adapter", "both")  # train.lora.export (legalpt.train.lora)
# train.lora.target_modules by default: the attention and MLP projections of the Llama, Mistral and Qwen2 families
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# data.vocab_size of a BPE legalpt.data.tokenizer trains: the 256 bytes and its three special tokens
MIN_BPE_VOCAB = 256 + 3


class ConfigError(ValueError):
    """A config value outside its range or choices; the message starts with the value's full key."""


def _expect(ok: bool, key: str, expected: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"{key}: expected {expected}, got {got!r}")


def _at_least(low: int, node: object, key: str, *names: str) -> None:
    """Each integer field `names` of `node`, which sits at `key`, is >= low."""
    for name in names:
        _expect(getattr(node, name) >= low, f"{key}.{name}", f"an integer >= {low}", getattr(node, name))


def _positive(key: str, value: float) -> None:
    _expect(math.isfinite(value) and value > 0, key, "a finite number > 0", value)


def _one_of(key: str, value: str, choices: Sequence[str]) -> None:
    _expect(value in choices, key, f"one of {', '.join(choices)}", value)


def _validate_attn_implementation(key: str, name: str) -> None:
    """What transformers' `from_pretrained(attn_implementation=...)` takes once legalpt.hf has registered legalpt's:
    legalpt, eager, a name in transformers' AttentionInterface, or a hub kernel ("org/repo")."""
    if name in ("legalpt", "eager"):  # legalpt.hf.NAME and transformers' built-in: no registry to import
        return
    from transformers import AttentionInterface
    from transformers.integrations.hub_kernels import is_kernel

    registered = sorted(AttentionInterface().valid_keys())
    expected = f"legalpt, eager, one of {', '.join(registered)} or a hub kernel 'org/repo'"
    _expect(name in registered or is_kernel(name), key, expected, name)


@dataclass
class RopeScalingConfig:
    """RoPE stretched past the context a model was trained at (transformers' `rope_parameters`): for continued
    pretraining of a checkpoint on longer documents, or a new model meant to run longer than it trains."""

    type: str = "none"  # none | linear | dynamic (NTK) | llama3 | yarn
    factor: float = 1.0  # context multiplier (>= 1): the model covers factor * original_max_position_embeddings
    # context the model was trained at; None = the preset's max_position_embeddings or the checkpoint's
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3: wavelengths above original / low_freq_factor are divided by factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original / high_freq_factor are kept (> low_freq_factor)
    beta_fast: float = 32.0  # yarn: rotations in the original context above which a dimension is kept
    beta_slow: float = 1.0  # yarn: rotations below which a dimension is interpolated (< beta_fast)
    attention_factor: float | None = None  # yarn: cos/sin scale; None = 0.1 * ln(factor) + 1, as in the paper

    def validate(self, key: str = "model.rope_scaling") -> None:
        """Raise ConfigError at the first bad field; the type's own parameters are checked only for that type."""
        _one_of(f"{key}.type", self.type, ROPE_SCALINGS)
        if self.type == "none":
            return
        _expect(math.isfinite(self.factor) and self.factor >= 1, f"{key}.factor", "a finite number >= 1", self.factor)
        original = self.original_max_position_embeddings
        _expect(original is None or original >= 1, f"{key}.original_max_position_embeddings", "None or an integer >= 1",
                original)  # fmt: skip
        if self.type == "llama3":
            _positive(f"{key}.low_freq_factor", self.low_freq_factor)
            _expect(self.high_freq_factor > self.low_freq_factor, f"{key}.high_freq_factor",
                    f"a number > {key}.low_freq_factor ({self.low_freq_factor})", self.high_freq_factor)  # fmt: skip
        if self.type == "yarn":
            _positive(f"{key}.beta_slow", self.beta_slow)
            _expect(self.beta_fast > self.beta_slow, f"{key}.beta_fast",
                    f"a number > {key}.beta_slow ({self.beta_slow})", self.beta_fast)  # fmt: skip
            if self.attention_factor is not None:
                _positive(f"{key}.attention_factor", self.attention_factor)


@dataclass
class ModelConfig:
    """A Hugging Face decoder built from these fields, or loaded from `pretrained`."""

    arch: str = "llama"  # HF model_type of a new model: llama | mistral | qwen2
    hidden_size: int = 384  # width of the residual stream (a multiple of num_heads)
    num_layers: int = 8  # decoder blocks
    num_heads: int = 6  # query heads (a multiple of num_kv_heads)
    num_kv_heads: int = 6  # key/value heads (< num_heads for GQA, 1 for MQA)
    intermediate_size: int = 1024  # width of the MLP
    max_position_embeddings: int = 4096  # longest sequence RoPE is set up for
    rope_theta: float = 10000.0  # RoPE base frequency
    # RoPE scaling (model.rope_scaling.type=yarn model.rope_scaling.factor=4); applies to `pretrained` too, replacing
    # the checkpoint's own RoPE settings
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    sliding_window: int | None = None  # attention window of mistral/qwen2 models; None = full causal
    tie_word_embeddings: bool = True  # share input embedding and LM head (saves parameters on small models)
    pretrained: str | None = None  # HF folder or hub id; when set, the architecture fields above are ignored
    # transformers attention: legalpt | eager | sdpa | flex_attention | flash_attention_2 | ... (any name registered
    # in transformers' AttentionInterface) | a hub kernel "org/repo"
    attn_implementation: str = "legalpt"
    # backend behind legalpt attention: auto (fa3 on Hopper, fa2 on other sm80+ GPUs, else reference) | reference |
    # fa2 | fa3 | sdpa | flex (legalpt.attention.BACKENDS)
    attention_backend: str = "auto"
    dtype: str = "float32"  # parameter dtype: float32 | bfloat16 | float16 (autocast follows train.mixed_precision)

    def validate(self, key: str = "model") -> None:
        """Raise ConfigError at the first bad field. The architecture is checked only for a new model (a pretrained
        one brings its own); the attention choices come last, as they import torch and transformers."""
        _one_of(f"{key}.dtype", self.dtype, DTYPES)
        if not self.pretrained:
            self._validate_architecture(key)
        self.rope_scaling.validate(f"{key}.rope_scaling")
        from legalpt.attention import BACKENDS  # imports torch (no CUDA)

        _one_of(f"{key}.attention_backend", self.attention_backend, BACKENDS)
        _validate_attn_implementation(f"{key}.attn_implementation", self.attn_implementation)

    def _validate_architecture(self, key: str) -> None:
        _one_of(f"{key}.arch", self.arch, ARCHS)
        _at_least(1, self, key, "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                  "max_position_embeddings")  # fmt: skip
        for whole, part in (("hidden_size", "num_heads"), ("num_heads", "num_kv_heads")):
            value, divisor = getattr(self, whole), getattr(self, part)
            _expect(value % divisor == 0, f"{key}.{whole}", f"a multiple of {key}.{part} ({divisor})", value)
        _positive(f"{key}.rope_theta", self.rope_theta)
        if self.sliding_window is not None:
            _expect(self.arch != "llama", f"{key}.sliding_window", f"None for {key}.arch llama (no sliding window)",
                    self.sliding_window)  # fmt: skip
            _expect(self.sliding_window >= 1, f"{key}.sliding_window", "None or an integer >= 1", self.sliding_window)


@dataclass
class CleanConfig:
    """Cleaning steps applied to every document before dedup and tokenization; each can be switched off."""

    enabled: bool = True  # False = documents are used exactly as loaded
    unicode_nfkc: bool = True  # NFKC normalization, curly quotes and odd spaces to plain ones
    dehyphenate: bool = True  # join words broken by a hyphen at a line end ("agree-\nment" → "agreement")
    page_furniture: bool = True  # drop repeated page headers/footers and bare page numbers
    line_numbers: bool = True  # drop pleading-paper line numbers (1..28 at line starts)
    markup: bool = True  # drop stray HTML/XML tags and entities left in text
    whitespace: bool = True  # collapse runs of spaces and of blank lines


@dataclass
class DedupConfig:
    """Removal of exact and near-duplicate, and contained, documents across the whole corpus."""

    exact: bool = True  # drop documents whose normalized text hashes equal an earlier one's
    near: bool = True  # drop near-duplicates found by MinHash LSH
    threshold: float = 0.8  # Jaccard similarity of shingle sets at which two documents are duplicates
    containment: bool = True  # drop a document whose text lies within a longer kept one (a copy plus an exhibit)
    containment_threshold: float = 0.9  # share of a document's shingles found in the longer one that makes it so
    shingle_words: int = 5  # words per shingle
    num_perm: int = 128  # MinHash permutations (at least 2)
    examples: int = 5  # duplicate pairs listed in the report

    def validate(self, key: str = "data.dedup") -> None:
        """Raise ConfigError at the first bad field."""
        _expect(0 < self.threshold <= 1, f"{key}.threshold", "a number in (0, 1]", self.threshold)
        ratio = self.containment_threshold
        _expect(0 < ratio <= 1, f"{key}.containment_threshold", "a number in (0, 1]", ratio)
        _at_least(1, self, key, "shingle_words")
        _at_least(2, self, key, "num_perm")
        _at_least(0, self, key, "examples")


@dataclass
class SourceConfig:
    """One source of documents: a dataset read through `datasets.load_dataset` (a hub id, a local dataset folder, or
    a builder such as "json" with `data_files`), or local files read by legalpt's own readers (`paths`)."""

    name: str | None = None  # hub id ("harvard-lil/cold-cases"), local dataset folder, or builder ("json", "parquet")
    config: str | None = None  # configuration (subset) of the dataset, e.g. "sample-10BT"; None = its default
    data_files: list[str] = field(default_factory=list)  # files of `name` to read (globs; hub files as hf://...)
    split: str = "train"  # split to read
    paths: list[str] = field(default_factory=list)  # instead of `name`: files, folders or globs, as in data.paths
    text_field: str = "text"  # field of the text; a dotted path through lists ("opinions.opinion_text") joins them
    id_field: str | None = None  # field of the document id; None = "<source>:<record number>"
    meta_fields: list[str] = field(default_factory=list)  # fields of a dataset record kept in the document's meta
    distinct_field: str | None = None  # a record repeating an earlier one's value here is skipped (QA repeats)
    kind: str | None = None  # contract | opinion | statute | other for every document; None = guessed per document
    weight: float = 1.0  # share of this source's characters in the mixture (normalized over all sources)
    streaming: bool = False  # load_dataset(streaming=True): records are fetched only as far as the mixture needs
    max_documents: int = 0  # documents taken from this source at most; 0 = all

    def validate(self, key: str) -> None:
        """Raise ConfigError at the first bad field; `key` is where the source sits (data.sources.<name>)."""
        if bool(self.name) == bool(self.paths):
            raise ConfigError(f"{key}: expected either a dataset `name` or local `paths`, got "
                              f"{'both' if self.name else 'neither'}")  # fmt: skip
        _expect(bool(self.text_field), f"{key}.text_field", "a field name", self.text_field)
        _expect(self.kind is None or self.kind in KINDS, f"{key}.kind", f"one of {', '.join(KINDS)} or None", self.kind)
        _positive(f"{key}.weight", self.weight)
        _at_least(0, self, key, "max_documents")


@dataclass
class SFTConfig:
    """Supervised fine-tuning examples (data.format=sft): the columns that hold them and how they are rendered."""

    prompt_field: str = "prompt"  # column of a pair's prompt (context: no loss)
    response_field: str = "response"  # column of a pair's response (the tokens trained on)
    system_field: str | None = None  # column of an optional system message before a pair's prompt; None = none
    messages_field: str = "messages"  # column of a chat, a list of {role, content}; read when a record has it
    # auto (the tokenizer's chat template when it has one, else plain) | chat (the tokenizer's, required) | plain
    # ("### Instruction:\n<prompt>\n\n### Response:\n<response><eos>")
    template: str = "auto"

    def validate(self, key: str = "data.sft") -> None:
        """Raise ConfigError at the first bad field."""
        for name in ("prompt_field", "response_field", "messages_field"):
            _expect(bool(getattr(self, name)), f"{key}.{name}", "a column name", getattr(self, name))
        _expect(self.system_field != "", f"{key}.system_field", "a column name or None", self.system_field)
        _one_of(f"{key}.template", self.template, SFT_TEMPLATES)


@dataclass
class DataConfig:
    """Where documents come from and how they become packed rows of token ids."""

    paths: list[str] = field(default_factory=list)  # files, folders or globs; empty (and no sources) = the demo corpus
    # Named sources, mixed by weight with `paths` (the source "files", weight 1); a dict so that presets compose and
    # the command line reaches one by name: data.sources.replay.weight=0.05
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    text_field: str = "text"  # field holding the document text in .jsonl/.json/.parquet records
    synthetic_documents: int = 160  # demo documents generated when `paths` and `sources` are empty; 0 = no demo
    # demo documents of one kind joined in order until each holds this many characters (a long-document corpus,
    # data=demo_long); 0 = as generated
    synthetic_min_chars: int = 0
    seed: int = 0  # seed of the demo corpus and of the train/held-out split
    heldout_fraction: float = 0.05  # share of documents kept out of training for evaluation, in [0, 1)
    seq_len: int = 512  # tokens per packed row (at least 2)
    tokenizer: str | None = None  # HF folder or hub id; None = model.pretrained's tokenizer, else train a BPE
    vocab_size: int = 8192  # size of the byte-level BPE trained on the corpus (at least 259)
    # add legal tokens (reporter abbreviations, BPE merges of corpus words) when they help unmined documents
    extend_tokenizer: bool = False
    extra_tokens: int = 1024  # most tokens extend_tokenizer adds: reporters first, then merges, by tokens saved
    compare_tokenizers: list[str] = field(default_factory=list)  # more HF tokenizers whose tokens/byte the report lists
    bos: bool = False  # start every document with the tokenizer's bos token (its first token then gets a loss too)
    eos: bool = True  # end every document with eos (what the model learns to stop on)
    chunk_overlap: int = 0  # tokens of a document split across rows repeated as (loss-free) context in its next row
    output_dir: str | None = None  # folder of packed rows, report.json, lengths.png; None = <cache_dir>/packed/<key>
    cache_dir: str = "~/.cache/legalpt"  # trained tokenizers and packed datasets are cached here
    num_proc: int = 1  # worker processes for cleaning, dedup signatures and tokenization
    streaming: bool = False  # train on paths and sources read, cleaned, tokenized, packed on the fly (no dedup)
    stream_heldout_rows: int = 64  # streaming: held-out rows taken from the start of the held-out stream for eval
    clean: CleanConfig = field(default_factory=CleanConfig)  # cleaning steps (data.clean.*)
    dedup: DedupConfig = field(default_factory=DedupConfig)  # duplicate removal (data.dedup.*)
    # text (documents: pretraining) | sft (prompt/response pairs or chats: supervised fine-tuning, see data.sft)
    format: str = "text"
    sft: SFTConfig = field(default_factory=SFTConfig)  # columns and template of fine-tuning examples (data.sft.*)

    def validate(self, key: str = "data", trains_bpe: bool = True) -> None:
        """Raise ConfigError at the first bad field; `trains_bpe`: no tokenizer is given (here or by the model)."""
        _expect(bool(self.text_field), f"{key}.text_field", "a field name", self.text_field)
        if not (self.paths or self.sources):  # the demo corpus, unless synthetic_documents=0 turned it off
            off = f"documents to read ({key}.synthetic_documents=0 turns the demo corpus off)"
            _expect(self.synthetic_documents != 0, f"{key}.paths", off, self.paths)
            _at_least(1, self, key, "synthetic_documents")
            _at_least(0, self, key, "synthetic_min_chars")
        _expect(0 <= self.heldout_fraction < 1, f"{key}.heldout_fraction", "a number in [0, 1)", self.heldout_fraction)
        _at_least(2, self, key, "seq_len")
        if trains_bpe and not self.tokenizer:
            _at_least(MIN_BPE_VOCAB, self, key, "vocab_size")
        _at_least(1 if self.extend_tokenizer else 0, self, key, "extra_tokens")
        _expect(0 <= self.chunk_overlap < self.seq_len, f"{key}.chunk_overlap",
                f"an integer in [0, {key}.seq_len = {self.seq_len})", self.chunk_overlap)  # fmt: skip
        _at_least(1, self, key, "num_proc")
        _at_least(0, self, key, "stream_heldout_rows")
        self.dedup.validate(f"{key}.dedup")
        for name, source in self.sources.items():
            source.validate(f"{key}.sources.{name}")
        _one_of(f"{key}.format", self.format, DATA_FORMATS)
        if self.format == "sft":
            self._validate_sft(key)

    def _validate_sft(self, key: str) -> None:
        """Fine-tuning examples are read whole, each packed as one segment: options of documents do not apply."""
        self.sft.validate(f"{key}.sft")
        for name, default in (("streaming", False), ("extend_tokenizer", False), ("chunk_overlap", 0),
                              ("synthetic_min_chars", 0), ("compare_tokenizers", [])):  # fmt: skip
            _expect(getattr(self, name) == default, f"{key}.{name}", f"{default} with {key}.format=sft",
                    getattr(self, name))  # fmt: skip
        for name, source in self.sources.items():  # sources are concatenated in order, not mixed
            where = f"{key}.sources.{name}"
            _expect(source.weight == 1.0, f"{where}.weight", f"1 with {key}.format=sft (no mixture)", source.weight)
            _expect(not source.streaming, f"{where}.streaming", f"false with {key}.format=sft", source.streaming)


@dataclass
class LoraConfig:
    """Low-rank adapters (LoRA, through peft) trained on a frozen `model.pretrained` instead of every weight."""

    enabled: bool = False  # train adapters only; the checkpoint's own weights stay frozen
    r: int = 16  # rank of each adapter (A: r x in, B: out x r)
    alpha: float = 32.0  # an adapter's update is scaled by alpha / r
    dropout: float = 0.0  # dropout on the adapters' input, in [0, 1); > 0 keeps a copy of each input for backward
    # linear layers that get an adapter: module names, matched as the last part of the layer's path
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    # merged (adapters folded into the plain HF folder hf/) | adapter (a peft folder adapter/ over model.pretrained)
    # | both
    export: str = "merged"

    def validate(self, key: str = "train.lora") -> None:
        """Raise ConfigError at the first bad field."""
        _at_least(1, self, key, "r")
        _positive(f"{key}.alpha", self.alpha)
        _expect(0 <= self.dropout < 1, f"{key}.dropout", "a number in [0, 1)", self.dropout)
        targets = list(self.target_modules)
        _expect(bool(targets) and all(isinstance(t, str) and t for t in targets), f"{key}.target_modules",
                "a non-empty list of module names", targets)  # fmt: skip
        _one_of(f"{key}.export", self.export, LORA_EXPORTS)


@dataclass
class TrainConfig:
    """The optimisation loop: schedule, precision, evaluation and checkpoints."""

    output_dir: str = "runs/${now:%Y%m%d-%H%M%S}"  # run folder: checkpoints, HF export, wandb, log
    steps: int = 100  # optimizer steps
    batch_size: int = 8  # packed rows per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio, in [0, 1]
    warmup_steps: int = 10  # linear warmup from 0 to lr
    weight_decay: float = 0.1  # AdamW decay on matrices (not on norms and biases)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW betas, each in [0, 1)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    mixed_precision: str = "auto"  # auto (bf16 where the GPU supports it) | bf16 | fp16 | no
    eval_every: int = 20  # steps between held-out evaluations (also at step 0 and at the end); 0 = none
    eval_batches: int = 8  # held-out micro-batches per evaluation; 0 = the whole held-out split
    # live evaluation on held-out documents (legalpt.train.live_eval), with legalpt-eval's eval.* settings:
    eval_citations: int = 0  # citation items continued greedily and scored at each one; 0 = no citation metrics
    eval_documents: int = 0  # held-out documents scored whole for eval/bits_per_byte at each one; 0 = none
    eval_documents_every: int = 0  # steps between them (also at step 0 and at the end); 0 = train.eval_every
    # steps between resumable checkpoints (also at the end, and on a stop signal); 0 = none (a run that cannot resume)
    save_every: int = 50
    # the final export: the trained model as an HF folder (hf/; a LoRA run: as train.lora.export says); false for
    # throughput measurements
    export_hf: bool = True
    keep_checkpoints: int = 2  # newest resumable checkpoints kept on disk
    resume: str = "auto"  # auto (latest checkpoint in output_dir, if any) | none | path to a checkpoint folder
    log_every: int = 10  # steps between logged metrics
    peak_tflops: float | None = None  # dense bf16 TFLOP/s of one device for MFU; None = by GPU name (unknown: no MFU)
    seed: int = 0  # seed of initialisation and data order
    # bit-identical reruns on a GPU: torch's deterministic algorithms (an op without one raises) and legalpt
    # attention's backward without atomics (legalpt.hf); slower
    deterministic: bool = False
    # plain (HF's loss over the full float32 logits) | chunked (loss_chunk_tokens at a time, recomputed in backward)
    # | fused (Liger-Kernel's fused linear cross-entropy: no logits kept, no recompute; CUDA, the `fused` extra)
    loss_impl: str = "plain"
    loss_chunk_tokens: int = 4096  # tokens whose logits loss_impl=chunked holds at once (recomputed in backward)
    # recompute in backward: none | full (every decoder layer) | selective (every checkpoint_every-th layer) |
    # attention (the attention modules only)
    activation_checkpointing: str = "none"
    checkpoint_every: int = 2  # activation_checkpointing=selective: layers 0, k, 2k, ... are recomputed
    offload_activations: bool = False  # keep the decoder layers' saved activations in CPU memory (CUDA only)
    # full or selective: keep each recomputed layer's attention output and logsumexp (per token and layer, an element
    # per hidden unit and a float per head, on the GPU), so that backward's recompute skips attention
    save_attention: bool = False
    # tokens each decoder layer's MLP runs at once (in training each chunk is recomputed in backward), so that only
    # one chunk's intermediates exist at a time (the longest rows); 0 = whole rows
    mlp_chunk_tokens: int = 0
    # processes: ddp (a full replica each) | fsdp2 (parameters, gradients and AdamW state sharded per decoder layer)
    distributed: str = "ddp"
    # autocast (float32 parameters, compute autocast to train.mixed_precision) | bf16-fsdp (fsdp2 only: bfloat16 copies
    # of the parameters compute, float32 master weights and AdamW state, gradients reduced in float32)
    precision: str = "autocast"
    reshard_after_forward: bool = True  # fsdp2: free each layer's gathered parameters after forward (False: keep them)
    # processes that share each row, its tokens split among them (ring attention: legalpt.train.context); consecutive
    # ranks form a group, each group one data-parallel replica; 1 = off
    context_parallel: int = 1
    compile: bool = False  # torch.compile each decoder layer on its own (layers of one shape share its graph)
    compile_mode: str = "default"  # train.compile: default | max-autotune-no-cudagraphs (longer compile, tuned matmuls)
    # torch.profiler over steps profile_start + 1 .. profile_start + profile_steps (legalpt.train.profiling): a trace,
    # an operator table and where the step's time goes, in <run folder>/profile/; 0 = off
    profile_steps: int = 0
    profile_start: int = 3  # steps completed before the profile starts (past warm-up and compilation)
    lora: LoraConfig = field(default_factory=LoraConfig)  # adapters instead of full fine-tuning (train.lora.*)

    def validate(self, key: str = "train") -> None:
        """Raise ConfigError at the first bad field."""
        _expect(bool(self.output_dir), f"{key}.output_dir", "a folder", self.output_dir)
        _at_least(1, self, key, "steps", "batch_size", "grad_accum", "log_every", "keep_checkpoints")
        _at_least(0, self, key, "save_every", "eval_every", "warmup_steps", "eval_batches", "eval_citations",
                  "eval_documents", "eval_documents_every", "profile_steps", "profile_start",
                  "mlp_chunk_tokens")  # fmt: skip
        _positive(f"{key}.lr", self.lr)
        _expect(0 <= self.min_lr_ratio <= 1, f"{key}.min_lr_ratio", "a number in [0, 1]", self.min_lr_ratio)
        _expect(self.weight_decay >= 0, f"{key}.weight_decay", "a number >= 0", self.weight_decay)
        betas = list(self.betas)
        _expect(len(betas) == 2 and all(0 <= b < 1 for b in betas), f"{key}.betas", "two numbers in [0, 1)", betas)
        _expect(self.grad_clip >= 0, f"{key}.grad_clip", "a number >= 0 (0 = off)", self.grad_clip)
        if self.peak_tflops is not None:
            _positive(f"{key}.peak_tflops", self.peak_tflops)
        _one_of(f"{key}.mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        _expect(bool(self.resume), f"{key}.resume", "auto, none or a checkpoint folder", self.resume)
        _one_of(f"{key}.loss_impl", self.loss_impl, LOSS_IMPLS)
        _at_least(1, self, key, "loss_chunk_tokens", "checkpoint_every", "context_parallel")
        _one_of(f"{key}.activation_checkpointing", self.activation_checkpointing, ACTIVATION_CHECKPOINTING)
        if self.save_attention:
            _expect(self.activation_checkpointing in RECOMPUTED_LAYERS, f"{key}.activation_checkpointing",
                    f"full or selective with {key}.save_attention=true", self.activation_checkpointing)  # fmt: skip
            # torch's selective checkpointing keeps what it saves out of save_on_cpu's reach: on the GPU
            _expect(not self.offload_activations, f"{key}.offload_activations",
                    f"false with {key}.save_attention=true (its outputs would stay on the GPU)",
                    self.offload_activations)  # fmt: skip
        _one_of(f"{key}.distributed", self.distributed, DISTRIBUTED)
        _one_of(f"{key}.precision", self.precision, PRECISIONS)
        _one_of(f"{key}.compile_mode", self.compile_mode, COMPILE_MODES)
        if self.eval_every == 0 and (self.eval_citations or self.eval_documents):  # their cadence defaults to it
            _expect(self.eval_documents_every >= 1, f"{key}.eval_documents_every", f"a number >= 1 with "
                    f"{key}.eval_every=0 and live evaluation on", self.eval_documents_every)  # fmt: skip
        if self.profile_steps:
            _expect(self.profile_start + self.profile_steps <= self.steps, f"{key}.profile_start",
                    f"at most train.steps - train.profile_steps = {self.steps - self.profile_steps}",
                    self.profile_start)  # fmt: skip
        self.lora.validate(f"{key}.lora")
        if self.compile:  # Dynamo cannot trace save_on_cpu's hooks: each layer would fall back to eager
            _expect(not self.offload_activations, f"{key}.offload_activations", f"false with {key}.compile=true",
                    self.offload_activations)  # fmt: skip
            _expect(self.context_parallel == 1, f"{key}.context_parallel", f"1 with {key}.compile=true (the ring's "
                    "point-to-point transfers would break each layer's graph)", self.context_parallel)  # fmt: skip
        if self.precision == "bf16-fsdp":  # FSDP2's MixedPrecisionPolicy casts the parameters; DDP has none
            _expect(self.distributed == "fsdp2", f"{key}.distributed", f"fsdp2 with {key}.precision=bf16-fsdp",
                    self.distributed)  # fmt: skip
            _expect(self.mixed_precision in ("auto", "bf16"), f"{key}.mixed_precision",
                    f"auto or bf16 with {key}.precision=bf16-fsdp", self.mixed_precision)  # fmt: skip


@dataclass
class GenerationConfig:
    """How the model continues a prompt (batched, KV cache)."""

    max_new_tokens: int = 24  # tokens generated per prompt
    do_sample: bool = False  # False = greedy
    temperature: float = 1.0  # sampling temperature (with do_sample), > 0
    top_p: float = 1.0  # nucleus sampling mass (with do_sample), in (0, 1]
    batch_size: int = 16  # prompts per generate() call

    def validate(self, key: str = "eval.generation") -> None:
        """Raise ConfigError at the first bad field; temperature and top_p only matter when sampling."""
        _at_least(1, self, key, "max_new_tokens", "batch_size")
        if self.do_sample:
            _positive(f"{key}.temperature", self.temperature)
            _expect(0 < self.top_p <= 1, f"{key}.top_p", "a number in (0, 1]", self.top_p)


@dataclass
class CitationEvalConfig:
    """Citation completion and citation-set tasks, built from held-out opinions with eyecite."""

    prompt_tokens: int = 256  # tokens of text before a citation given as its prompt (extended to keep the case name)
    max_items: int = 200  # citation prompts evaluated, spread over documents with eval.seed; 0 = all
    set_documents: int = 16  # opinions continued for citation-set precision/recall; 0 = task off
    set_prompt_tokens: int = 512  # prompt length of each continued opinion
    set_new_tokens: int = 256  # tokens generated (and compared with the real continuation of the same length)

    def validate(self, key: str = "eval.citations") -> None:
        """Raise ConfigError at the first bad field."""
        _at_least(1, self, key, "prompt_tokens", "set_prompt_tokens", "set_new_tokens")
        _at_least(0, self, key, "max_items", "set_documents")


@dataclass
class HarnessConfig:
    """lm-evaluation-harness (`lm-eval`) tasks run on the loaded checkpoint through the harness's HF model class."""

    # task, group or tag names of the harness (`lm-eval ls tasks`), e.g. legalbench, mmlu_professional_law,
    # hellaswag; or of task YAMLs under include_path. Empty = task off
    tasks: list[str] = field(default_factory=list)
    num_fewshot: int | None = None  # examples in each prompt; None = each task's own default
    limit: float | None = None  # examples per task: a count >= 1, or a fraction in (0, 1); None = all
    batch_size: int | None = None  # sequences per forward pass; None = eval.batch_size
    include_path: str | None = None  # folder of your own task YAMLs; a name there overrides the harness's own
    apply_chat_template: bool = False  # wrap prompts in the tokenizer's chat template (instruction-tuned models)
    # keep every scored example in the report (harness.samples.<task>: prompt, target, answer after the task's
    # filters, metric values, and the harness's prompt hash, to line up with `lm_eval --log_samples`)
    log_samples: bool = False

    def validate(self, key: str = "eval.harness") -> None:
        """Raise ConfigError at the first bad field."""
        names = list(self.tasks)
        _expect(all(isinstance(n, str) and n for n in names), f"{key}.tasks", "a list of task names", names)
        if self.num_fewshot is not None:
            _at_least(0, self, key, "num_fewshot")
        if self.batch_size is not None:
            _at_least(1, self, key, "batch_size")
        limit = self.limit
        _expect(limit is None or 0 < limit < 1 or (limit >= 1 and float(limit).is_integer()), f"{key}.limit",
                "None, a whole number >= 1 or a fraction in (0, 1)", limit)  # fmt: skip


@dataclass
class EvalConfig:
    """`legalpt-eval`: perplexity, citation accuracy, multiple choice and lm-evaluation-harness tasks of one
    checkpoint, or two side by side."""

    checkpoint: str | None = None  # HF folder, run folder or hub id; None = the newest run's export under `runs_dir`
    compare: str | None = None  # a second checkpoint evaluated on the same items (e.g. base vs legal continuation)
    runs_dir: str = "runs"  # where `checkpoint=None` looks for the newest run
    output_dir: str | None = None  # report folder; None = <checkpoint>/eval (./eval for a hub id)
    # any of perplexity | response_loss | citations | citation_set | choice | harness; choice runs only when
    # choice_data is set, harness only when harness.tasks is; response_loss only with data.format=sft (the loss on
    # held-out examples' responses), perplexity and the citation tasks only with data.format=text (documents)
    tasks: list[str] = field(default_factory=lambda: list(EVAL_TASKS))
    batch_size: int = 4  # sequences per forward pass: perplexity, multiple choice; response_loss packs rows
    max_documents: int = 0  # documents (or response_loss's examples) scored, in corpus order; 0 = all
    # heldout = the corpus's held-out split; all = every document. Either way the checkpoints' training documents
    # (their run's training_documents.jsonl) are left out and counted
    documents: str = "heldout"
    perplexity_context: int = 0  # tokens per window (at least 2); 0 = the model's max_position_embeddings
    perplexity_stride: int = 0  # new tokens scored per window past the first (< the context); 0 = half the context
    citations: CitationEvalConfig = field(default_factory=CitationEvalConfig)  # citation tasks (eval.citations.*)
    generation: GenerationConfig = field(default_factory=GenerationConfig)  # decoding (eval.generation.*)
    choice_data: str | None = None  # CaseHOLD or LegalBench-style data: .csv/.tsv/.jsonl file or hub dataset name
    choice_format: str = "auto"  # auto | casehold | legalbench
    choice_split: str = "test"  # split of a hub dataset
    harness: HarnessConfig = field(default_factory=HarnessConfig)  # lm-evaluation-harness tasks (eval.harness.*)
    eval_set: str | None = None  # eval_set.jsonl written by an earlier run: reuse its prompts and gold citations
    bootstrap: int = 1000  # bootstrap resamples (over documents) for confidence intervals; 0 = no intervals
    seed: int = 0  # seed of item sampling, bootstrap and sampled generation

    def validate(self, key: str = "eval") -> None:
        """Raise ConfigError at the first bad field."""
        unknown = [task for task in self.tasks if task not in EVAL_TASKS]
        _expect(not unknown, f"{key}.tasks", f"a subset of {', '.join(EVAL_TASKS)}", list(self.tasks))
        _at_least(1, self, key, "batch_size")
        _at_least(0, self, key, "max_documents", "bootstrap")
        context, stride = self.perplexity_context, self.perplexity_stride
        _expect(context == 0 or context >= 2, f"{key}.perplexity_context", "0 or an integer >= 2", context)
        if context:
            _expect(0 <= stride < context, f"{key}.perplexity_stride",
                    f"an integer in [0, {key}.perplexity_context = {context})", stride)  # fmt: skip
        else:
            _at_least(0, self, key, "perplexity_stride")
        _one_of(f"{key}.choice_format", self.choice_format, CHOICE_FORMATS)
        _one_of(f"{key}.documents", self.documents, EVAL_DOCUMENTS)
        self.citations.validate(f"{key}.citations")
        self.generation.validate(f"{key}.generation")
        self.harness.validate(f"{key}.harness")


@dataclass
class Config:
    """Root of every legalpt config."""

    model: ModelConfig = field(default_factory=ModelConfig)  # the network (model.*; presets in conf/model/)
    data: DataConfig = field(default_factory=DataConfig)  # corpus, tokenizer and packing (data.*; conf/data/)
    train: TrainConfig = field(default_factory=TrainConfig)  # the loop (train.*; conf/train/)
    eval: EvalConfig = field(default_factory=EvalConfig)  # legalpt-eval (eval.*; conf/eval/)
    logger: str = "wandb"  # wandb (offline unless WANDB_API_KEY is set) | none
    project: str = "legalpt"  # wandb project name

    def validate(self) -> None:
        """Raise ConfigError at the first bad field. The model comes last: its attention choices import torch and
        transformers, so that a bad value elsewhere fails at once; then data.seq_len against the model's positions."""
        self.data.validate("data", trains_bpe=not self.model.pretrained)
        self.train.validate("train")
        self.eval.validate("eval")
        _one_of("logger", self.logger, LOGGERS)
        self.model.validate("model")
        self._validate_context()
        if self.train.eval_citations or self.train.eval_documents:
            self._validate_live_eval()
        if self.train.lora.enabled:
            self._validate_lora()
        if self.train.context_parallel > 1:
            self._validate_context_parallel()
        if self.train.save_attention:
            self._validate_save_attention()

    def _validate_live_eval(self) -> None:
        """The live evaluation reads held-out documents."""
        on = "with train.eval_citations or train.eval_documents > 0"
        _expect(self.data.format == "text", "data.format", f"text {on} (documents to cite from)", self.data.format)
        if self.data.streaming:  # the held-out documents are read from the stream up to eval.max_documents
            _expect(self.eval.max_documents > 0, "eval.max_documents", f"an integer >= 1 with data.streaming {on}",
                    self.eval.max_documents)  # fmt: skip

    def _validate_context_parallel(self) -> None:
        """Ring attention is legalpt's, and every process of a group holds two equal chunks of each row."""
        cp = self.train.context_parallel
        on = f"with train.context_parallel={cp}"
        _expect(self.model.attn_implementation == "legalpt", "model.attn_implementation", f"legalpt {on} (ring "
                "attention runs on legalpt's backends)", self.model.attn_implementation)  # fmt: skip
        _expect(self.data.seq_len % (2 * cp) == 0, "data.seq_len", f"a multiple of {2 * cp} {on} (each process holds "
                "two equal chunks of every row)", self.data.seq_len)  # fmt: skip

    def _validate_save_attention(self) -> None:
        """Only the attention ops of legalpt's and sdpa's kernels are saved; the ring runs its own steps."""
        on = "with train.save_attention=true"
        implementation = self.model.attn_implementation
        _expect(implementation in ("legalpt", "sdpa"), "model.attn_implementation", f"legalpt or sdpa {on} (the "
                "implementations whose attention is one op to save)", implementation)  # fmt: skip
        _expect(self.train.context_parallel == 1, "train.context_parallel", f"1 {on} (ring attention's steps are not "
                "one op to save)", self.train.context_parallel)  # fmt: skip

    def _validate_context(self) -> None:
        """data.seq_len fits the positions the model covers (a checkpoint's are read from its config.json)."""
        from legalpt.model import max_positions  # imports transformers

        covered = max_positions(self.model)
        if covered is not None:
            positions, note = covered
            _expect(self.data.seq_len <= positions, "data.seq_len", f"at most {positions} ({note})", self.data.seq_len)

    def _validate_lora(self) -> None:
        """Adapters go over a checkpoint's weights as they are: its own vocabulary, and (for the adapter export,
        which names the checkpoint as its base) its own RoPE."""
        _expect(bool(self.model.pretrained), "model.pretrained", "a checkpoint with train.lora.enabled=true (adapters "
                "over a random model would train a random model)", self.model.pretrained)  # fmt: skip
        _expect(not self.data.extend_tokenizer, "data.extend_tokenizer", "false with train.lora.enabled=true (the new "
                "embedding rows would stay untrained)", self.data.extend_tokenizer)  # fmt: skip
        if self.train.lora.export != "merged":
            _expect(self.model.rope_scaling.type == "none", "model.rope_scaling.type", "none with train.lora.export="
                    f"{self.train.lora.export} (the adapter's base is model.pretrained as saved)",
                    self.model.rope_scaling.type)  # fmt: skip


ConfigStore.instance().store(name="legalpt_schema", node=Config)


def compose(command: str = "train", overrides: Sequence[str] = ()) -> DictConfig:
    """The config a command (`train`, `prepare`, `eval`) would see with these command-line overrides."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=command, overrides=list(overrides))


def to_config(cfg: DictConfig | Config) -> Config:
    """Resolve interpolations and return the typed `Config` (accepts one already typed), checked by `validate`."""
    config = cfg if isinstance(cfg, Config) else OmegaConf.to_object(cfg)
    config.validate()
    return config
