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
class DataConfig:
    """Where documents come from and how they become packed rows of token ids."""

    paths: list[str] = field(default_factory=list)  # files, folders or globs; empty = the built-in demo corpus
    text_field: str = "text"  # field holding the document text in .jsonl/.json/.parquet records
    synthetic_documents: int = 160  # number of demo documents generated when `paths` is empty
    seed: int = 0  # seed of the demo corpus and of the train/held-out split
    heldout_fraction: float = 0.05  # share of documents kept out of training for evaluation
    seq_len: int = 512  # tokens per packed row
    tokenizer: str | None = None  # HF folder or hub id; None = model.pretrained's tokenizer, else train a BPE
    vocab_size: int = 8192  # size of the byte-level BPE trained on the corpus
    cache_dir: str = "~/.cache/legalpt"  # trained tokenizers and packed datasets are cached here
    num_proc: int = 1  # worker processes for tokenization


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
class EvalConfig:
    """Held-out evaluation of a checkpoint (`legalpt-eval`)."""

    checkpoint: str | None = None  # HF export folder or hub id; None = the newest run's export under `runs_dir`
    runs_dir: str = "runs"  # where `checkpoint=None` looks for the newest run
    batch_size: int = 4  # packed rows per batch
    max_batches: int = 0  # 0 = the whole held-out split
    output: str | None = None  # JSON report path; None = eval.json next to the checkpoint


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
