"""The schema's checks: every preset passes, each bad value is named by its full key, the default attention is the
one legalpt registers, and importing the schema stays cheap."""

import inspect
import re
import subprocess
import sys
from dataclasses import fields, is_dataclass

import pytest

import legalpt.config as config
from legalpt.config import CONF_DIR, Config, ConfigError, ModelConfig, TrainConfig, compose, to_config

MODELS = sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))
DATA = sorted(path.stem for path in (CONF_DIR / "data").glob("*.yaml"))
SOURCES = sorted(path.stem for path in (CONF_DIR / "source").glob("*.yaml"))


@pytest.mark.parametrize("command", ["train", "prepare", "eval"])
def test_every_preset_passes(command):
    for model in MODELS:
        to_config(compose(command, [f"model={model}"]))
    for data in DATA:
        paths = ["data.paths=[corpus/]"] if data == "files" else []
        to_config(compose(command, [f"data={data}", *paths]))
    for source in SOURCES:
        to_config(compose(command, [f"+source@data.sources.extra={source}"]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.attention_backend=fa4", "model.attention_backend: expected one of auto, reference, fa2, fa3, sdpa, "
                                        "flex, got 'fa4'"),
        ("model.dtype=float64", "model.dtype: expected one of float32, bfloat16, float16, got 'float64'"),
        ("model.arch=gpt2", "model.arch: expected one of llama, mistral, qwen2, got 'gpt2'"),
        ("model.num_layers=0", "model.num_layers: expected an integer >= 1, got 0"),
        ("model.num_kv_heads=4", "model.num_heads: expected a multiple of model.num_kv_heads (4), got 6"),
        ("model.rope_theta=-1", "model.rope_theta: expected a finite number > 0, got -1.0"),
        ("model.sliding_window=8", "model.sliding_window: expected None for model.arch llama"),
        ("data.seq_len=1", "data.seq_len: expected an integer >= 2, got 1"),
        ("data.heldout_fraction=1", "data.heldout_fraction: expected a number in [0, 1), got 1.0"),
        ("data.chunk_overlap=512", "data.chunk_overlap: expected an integer in [0, data.seq_len = 512), got 512"),
        ("data.vocab_size=100", "data.vocab_size: expected an integer >= 259, got 100"),
        ("data.num_proc=0", "data.num_proc: expected an integer >= 1, got 0"),
        ("data.synthetic_documents=0", "data.paths: expected documents to read (data.synthetic_documents=0 turns"),
        ("data.dedup.threshold=0", "data.dedup.threshold: expected a number in (0, 1], got 0.0"),
        ("data.dedup.num_perm=1", "data.dedup.num_perm: expected an integer >= 2, got 1"),
        ("train.steps=0", "train.steps: expected an integer >= 1, got 0"),
        ("train.grad_accum=0", "train.grad_accum: expected an integer >= 1, got 0"),
        ("train.lr=0", "train.lr: expected a finite number > 0, got 0.0"),
        ("train.min_lr_ratio=1.5", "train.min_lr_ratio: expected a number in [0, 1], got 1.5"),
        ("train.betas=[0.9]", "train.betas: expected two numbers in [0, 1), got [0.9]"),
        ("train.mixed_precision=fp8", "train.mixed_precision: expected one of auto, bf16, fp16, no, got 'fp8'"),
        ("eval.tasks=[perplexity,rouge]", "eval.tasks: expected a subset of perplexity, response_loss, citations, "
                                          "citation_set, choice, harness, got ['perplexity', 'rouge']"),
        ("eval.harness.limit=2.5", "eval.harness.limit: expected None, a whole number >= 1 or a fraction in (0, 1), "
                                   "got 2.5"),
        ("eval.choice_format=mmlu", "eval.choice_format: expected one of auto, casehold, legalbench, got 'mmlu'"),
        ("eval.perplexity_context=1", "eval.perplexity_context: expected 0 or an integer >= 2, got 1"),
        ("eval.citations.prompt_tokens=0", "eval.citations.prompt_tokens: expected an integer >= 1, got 0"),
        ("eval.generation.max_new_tokens=0", "eval.generation.max_new_tokens: expected an integer >= 1, got 0"),
        ("logger=tensorboard", "logger: expected one of wandb, none, got 'tensorboard'"),
    ],
)  # fmt: skip
def test_a_bad_value_is_named_by_its_key(override, message):
    with pytest.raises(ConfigError) as error:
        to_config(compose("train", [override]))
    assert str(error.value).startswith(message)


def test_attn_implementation_lists_what_transformers_accepts():
    with pytest.raises(ConfigError) as error:
        to_config(compose("train", ["model.attn_implementation=flash"]))
    message = str(error.value)
    assert message.startswith("model.attn_implementation: expected legalpt, eager, one of ")
    assert "sdpa" in message and "flash_attention_2" in message and message.endswith("got 'flash'")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["weight=0"], r"data\.sources\.cases\.weight: expected a finite number > 0, got 0\.0"),
        (["kind=memo"], r"data\.sources\.cases\.kind: expected one of contract, opinion, statute, other or None"),
        (["max_documents=-1"], r"data\.sources\.cases\.max_documents: expected an integer >= 0, got -1"),
        (["paths=[x]"], r"data\.sources\.cases: expected either a dataset `name` or local `paths`, got both"),
        (["name=null"], r"data\.sources\.cases: expected either a dataset `name` or local `paths`, got neither"),
    ],
)
def test_a_bad_source_is_named_by_its_name(overrides, message):
    cfg = compose("prepare", ["data=cold_cases", *(f"data.sources.cases.{o}" for o in overrides)])
    with pytest.raises(ConfigError, match=message):
        to_config(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attn_implementation=eager"],
        ["model.attn_implementation=sdpa"],
        ["model.attn_implementation=flash_attention_2"],
        ["model.attn_implementation=kernels-community/flash-attn2"],
        # A pretrained model brings its architecture and tokenizer: those fields are not checked.
        ["model.pretrained=some/model", "model.num_kv_heads=4", "model.sliding_window=8", "data.vocab_size=100"],
        ["data.tokenizer=some/tokenizer", "data.vocab_size=100"],
        ["data.paths=[corpus/]", "data.synthetic_documents=0"],
        ["eval.generation.temperature=0", "eval.generation.top_p=0"],  # used only when sampling
        ["eval.perplexity_context=128", "eval.perplexity_stride=64"],
    ],
)
def test_values_that_pass(overrides):
    to_config(compose("train", overrides))


@pytest.mark.parametrize("backend", ["auto", "reference", "fa2", "fa3", "sdpa", "flex"])
def test_every_attention_backend_passes(backend):
    from legalpt.attention import BACKENDS

    assert backend in BACKENDS
    to_config(compose("train", [f"model.attention_backend={backend}"]))


def test_sampling_needs_a_temperature_and_a_mass():
    sampling = ["eval.generation.do_sample=true"]
    with pytest.raises(ConfigError, match=r"^eval\.generation\.temperature: expected a finite number > 0, got 0\.0"):
        to_config(compose("eval", [*sampling, "eval.generation.temperature=0"]))
    with pytest.raises(ConfigError, match=r"^eval\.generation\.top_p: expected a number in \(0, 1\], got 1\.5"):
        to_config(compose("eval", [*sampling, "eval.generation.top_p=1.5"]))


def test_typed_configs_are_checked_too():
    assert to_config(Config()) == Config()
    with pytest.raises(ConfigError, match=r"^train\.steps"):
        to_config(Config(train=TrainConfig(steps=0)))


def test_the_default_attention_is_the_one_legalpt_registers():
    from legalpt import hf

    assert ModelConfig().attn_implementation == hf.NAME


def test_every_field_has_a_comment():
    for schema in (value for value in vars(config).values() if inspect.isclass(value) and is_dataclass(value)):
        lines, start = inspect.getsourcelines(schema)
        for f in fields(schema):
            i = next(n for n, line in enumerate(lines) if re.match(rf"\s+{f.name}: ", line))
            commented = "  # " in lines[i] or lines[i - 1].strip().startswith("#")
            assert commented, f"{schema.__name__}.{f.name} (line {start + i}) has no comment"


def test_importing_the_schema_loads_neither_torch_nor_transformers():
    code = "import sys, legalpt.config, legalpt.cli; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
