"""Typed configuration for every legalpt entry point.

The dataclasses here are the schema; the YAML files in `conf/` only choose values. They are registered with
Hydra's ConfigStore as `legalpt_schema`, so an unknown key or a value of the wrong type fails at composition time
with the key's full name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # the YAML groups shipped with the repository


@dataclass
class ModelConfig:
    """A Hugging Face decoder built from these fields, or loaded from `pretrained`."""

    arch: str = "llama"  # HF model_type of a new model: llama | mistral | qwen2
    hidden_size: int = 384  # width of the residual stream
    num_layers: int = 8  # decoder blocks
    num_heads: int = 6  # query heads
    num_kv_heads: int = 6  # key/value heads (< num_heads for GQA, 1 for MQA)
    intermediate_size: int = 1024  # width of the MLP
    max_position_embeddings: int = 4096  # longest sequence RoPE is set up for
    rope_theta: float = 10000.0  # RoPE base frequency
    sliding_window: int | None = None  # attention window of mistral/qwen2 models; None = full causal
    tie_word_embeddings: bool = True  # share input embedding and LM head (saves parameters on small models)
    pretrained: str | None = None  # HF folder or hub id; when set, the architecture fields above are ignored
    attn_implementation: str = "legalpt"  # transformers attention: legalpt | sdpa | eager
    attention_backend: str = "auto"  # backend behind legalpt attention: auto | reference | sdpa
    dtype: str = "float32"  # parameter dtype: float32 | bfloat16 | float16 (autocast follows train.mixed_precision)


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
    """Removal of exact and near-duplicate documents across the whole corpus."""

    exact: bool = True  # drop documents whose normalized text hashes equal an earlier one's
    near: bool = True  # drop near-duplicates found by MinHash LSH
    threshold: float = 0.8  # estimated Jaccard similarity of shingle sets at which two documents are duplicates
    shingle_words: int = 5  # words per shingle
    num_perm: int = 128  # MinHash permutations
    examples: int = 5  # duplicate pairs listed in the report


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


@dataclass
class DataConfig:
    """Where documents come from and how they become packed rows of token ids."""

    paths: list[str] = field(default_factory=list)  # files, folders or globs; empty (and no sources) = the demo corpus
    # Named sources, mixed by weight with `paths` (the source "files", weight 1); a dict so that presets compose and
    # the command line reaches one by name: data.sources.replay.weight=0.05
    sources: dict[str, SourceConfig] = field(default_factory=dict)
    text_field: str = "text"  # field holding the document text in .jsonl/.json/.parquet records
    synthetic_documents: int = 160  # number of demo documents generated when `paths` is empty
    seed: int = 0  # seed of the demo corpus and of the train/held-out split
    heldout_fraction: float = 0.05  # share of documents kept out of training for evaluation
    seq_len: int = 512  # tokens per packed row
    tokenizer: str | None = None  # HF folder or hub id; None = model.pretrained's tokenizer, else train a BPE
    vocab_size: int = 8192  # size of the byte-level BPE trained on the corpus
    extend_tokenizer: bool = False  # add legal tokens (reporter abbreviations, frequent corpus words) to the tokenizer
    extra_tokens: int = 1024  # most tokens extend_tokenizer adds: reporters first, then words, by tokens saved
    compare_tokenizers: list[str] = field(default_factory=list)  # more HF tokenizers whose tokens/byte the report lists
    bos: bool = False  # start every document with the tokenizer's bos token (its first token then gets a loss too)
    eos: bool = True  # end every document with eos (what the model learns to stop on)
    chunk_overlap: int = 0  # tokens of a document split across rows repeated as (loss-free) context in its next row
    output_dir: str | None = None  # folder of packed rows, report.json, lengths.png; None = <cache_dir>/packed/<key>
    cache_dir: str = "~/.cache/legalpt"  # trained tokenizers and packed datasets are cached here
    num_proc: int = 1  # worker processes for cleaning, dedup signatures and tokenization
    streaming: bool = False  # train on paths and sources read, cleaned, tokenized, packed on the fly (no dedup)
    stream_heldout_rows: int = 64  # streaming: held-out rows taken from the start of the held-out stream for eval
    clean: CleanConfig = field(default_factory=CleanConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)


@dataclass
class TrainConfig:
    """The optimisation loop: schedule, precision, evaluation and checkpoints."""

    output_dir: str = "runs/${now:%Y%m%d-%H%M%S}"  # run folder: checkpoints, HF export, wandb, log
    steps: int = 100  # optimizer steps
    batch_size: int = 8  # packed rows per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 10  # linear warmup from 0 to lr
    weight_decay: float = 0.1  # AdamW decay on matrices (not on norms and biases)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW betas
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    mixed_precision: str = "auto"  # auto (bf16 where the GPU supports it) | bf16 | fp16 | no
    eval_every: int = 20  # steps between held-out evaluations (also at step 0 and at the end)
    eval_batches: int = 8  # held-out micro-batches per evaluation; 0 = the whole held-out split
    save_every: int = 50  # steps between resumable checkpoints (also at the end)
    keep_checkpoints: int = 2  # newest resumable checkpoints kept on disk
    resume: str = "auto"  # auto (latest checkpoint in output_dir, if any) | none | path to a checkpoint folder
    log_every: int = 10  # steps between logged metrics
    seed: int = 0  # seed of initialisation and data order


@dataclass
class GenerationConfig:
    """How the model continues a prompt (batched, KV cache)."""

    max_new_tokens: int = 24  # tokens generated per prompt
    do_sample: bool = False  # False = greedy
    temperature: float = 1.0  # sampling temperature (with do_sample)
    top_p: float = 1.0  # nucleus sampling mass (with do_sample)
    batch_size: int = 16  # prompts per generate() call


@dataclass
class CitationEvalConfig:
    """Citation completion and citation-set tasks, built from held-out opinions with eyecite."""

    prompt_tokens: int = 256  # tokens of text before a citation given as its prompt (extended to keep the case name)
    max_items: int = 200  # citation prompts evaluated, spread over documents with eval.seed; 0 = all
    set_documents: int = 16  # opinions continued for citation-set precision/recall; 0 = task off
    set_prompt_tokens: int = 512  # prompt length of each continued opinion
    set_new_tokens: int = 256  # tokens generated (and compared with the real continuation of the same length)


@dataclass
class EvalConfig:
    """`legalpt-eval`: perplexity, citation accuracy and multiple choice of one checkpoint, or two side by side."""

    checkpoint: str | None = None  # HF folder, run folder or hub id; None = the newest run's export under `runs_dir`
    compare: str | None = None  # a second checkpoint evaluated on the same items (e.g. base vs legal continuation)
    runs_dir: str = "runs"  # where `checkpoint=None` looks for the newest run
    output_dir: str | None = None  # report folder; None = <checkpoint>/eval (./eval for a hub id)
    tasks: list[str] = field(
        default_factory=lambda: ["perplexity", "citations", "citation_set", "choice"]
    )  # choice runs only when choice_data is set
    batch_size: int = 4  # sequences per forward pass for perplexity and multiple choice
    max_documents: int = 0  # held-out documents used (perplexity, citation items); 0 = all
    perplexity_context: int = 0  # tokens per window; 0 = the model's max_position_embeddings
    perplexity_stride: int = 0  # new tokens scored per window past the first; 0 = half the context
    citations: CitationEvalConfig = field(default_factory=CitationEvalConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    choice_data: str | None = None  # CaseHOLD or LegalBench-style data: .csv/.tsv/.jsonl file or hub dataset name
    choice_format: str = "auto"  # auto | casehold | legalbench
    choice_split: str = "test"  # split of a hub dataset
    eval_set: str | None = None  # eval_set.jsonl written by an earlier run: reuse its prompts and gold citations
    bootstrap: int = 1000  # bootstrap resamples (over documents) for confidence intervals
    seed: int = 0  # seed of item sampling, bootstrap and sampled generation


@dataclass
class Config:
    """Root of every legalpt config."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: str = "wandb"  # wandb (offline unless WANDB_API_KEY is set) | none
    project: str = "legalpt"  # wandb project name


ConfigStore.instance().store(name="legalpt_schema", node=Config)


def compose(command: str = "train", overrides: Sequence[str] = ()) -> DictConfig:
    """The config a command (`train`, `prepare`, `eval`) would see with these command-line overrides."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=command, overrides=list(overrides))


def to_config(cfg: DictConfig | Config) -> Config:
    """Resolve interpolations and return the typed `Config` (accepts one already typed)."""
    if isinstance(cfg, Config):
        return cfg
    return OmegaConf.to_object(cfg)
