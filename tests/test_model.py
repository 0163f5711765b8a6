"""Model presets and `build_model`: new models from `ModelConfig`, pretrained checkpoints, parameter counts."""

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from legalpt.config import ARCHS, DTYPES, ModelConfig
from legalpt.model import build_model, count_parameters

PRESETS = Path(__file__).resolve().parents[1] / "conf" / "model"
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def make_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of exactly `vocab_size` tokens, built offline."""
    words = SPECIALS + [f"w{i}" for i in range(vocab_size - len(SPECIALS))]
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def preset(name: str, **overrides) -> ModelConfig:
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(PRESETS / f"{name}.yaml"), overrides)
    return OmegaConf.to_object(merged)


def stated_count(name: str) -> int:
    """The parameter count at vocab 32000 that the preset's first comment line states."""
    first_line = (PRESETS / f"{name}.yaml").read_text().splitlines()[0]
    assert first_line.startswith(f"# {name}:"), first_line
    return int(re.search(r"([\d,]+) parameters at vocab 32000", first_line).group(1).replace(",", ""))


def test_presets_are_the_expected_set():
    assert {path.stem for path in PRESETS.glob("*.yaml")} == {"tiny", "small", "125m", "350m", "1b", "8b"}


@pytest.mark.parametrize("name", ["tiny", "small", "125m", "350m", "1b", "8b"])
def test_preset_parameter_count_matches_its_comment(name):
    with torch.device("meta"):
        model = build_model(preset(name), make_tokenizer(32000))
    assert count_parameters(model) == stated_count(name)


@pytest.mark.parametrize("name", ["125m", "350m", "1b", "8b"])
def test_big_presets_are_llama_for_real_runs(name):
    cfg = preset(name)
    assert (cfg.arch, cfg.attention_backend) == ("llama", "auto")
    assert cfg.max_position_embeddings > preset("small").max_position_embeddings


def test_small_builds_with_about_20m_parameters():
    tokenizer = make_tokenizer(8192)
    model = build_model(preset("small"), tokenizer)
    assert 15e6 <= count_parameters(model) <= 25e6
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_tiny_builds_from_config_and_tokenizer(tiny_model_config):
    tokenizer = make_tokenizer(300)
    model = build_model(tiny_model_config(), tokenizer)
    config = model.config
    assert (config.model_type, config._attn_implementation) == ("llama", "legalpt")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (2, 64, 4)
    assert config.num_key_value_heads == 2
    assert config.vocab_size == len(tokenizer) == 300
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == ids
    assert model(torch.randint(300, (2, 16))).logits.shape == (2, 16, 300)


def test_every_arch_and_dtype_the_config_accepts_builds(tiny_model_config):
    for arch in ARCHS:
        assert build_model(tiny_model_config(arch=arch), make_tokenizer(300)).config.model_type == arch
    for dtype in DTYPES:
        assert str(build_model(tiny_model_config(dtype=dtype), make_tokenizer(300)).dtype) == f"torch.{dtype}"


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_sliding_window_archs_slide_in_every_layer(arch, tiny_model_config):
    model = build_model(tiny_model_config(arch=arch, sliding_window=16), make_tokenizer(300))
    assert model.config.model_type == arch
    assert model.config.sliding_window == 16
    if arch == "qwen2":
        assert model.config.layer_types == ["sliding_attention"] * 2
        assert all(layer.self_attn.sliding_window == 16 for layer in model.model.layers)


def test_count_parameters_counts_tied_embeddings_once(tiny_model_config):
    tokenizer = make_tokenizer(1000)
    tied = count_parameters(build_model(tiny_model_config(), tokenizer))
    untied = count_parameters(build_model(tiny_model_config(tie_word_embeddings=False), tokenizer))
    assert untied - tied == 1000 * 64


def test_a_new_model_is_created_on_the_device_asked_for(tiny_model_config):
    """`device`: a new model's weights are made there (the trainer's GPU), else on the CPU."""
    on_meta = build_model(tiny_model_config(), make_tokenizer(300), device="meta")
    assert {t.device.type for t in [*on_meta.parameters(), *on_meta.buffers()]} == {"meta"}
    assert {p.device.type for p in build_model(tiny_model_config(), make_tokenizer(300)).parameters()} == {"cpu"}


def test_pretrained_checkpoint_loads_with_its_tokenizer(tmp_path, tiny_model_config):
    tokenizer = make_tokenizer(300)
    saved = build_model(tiny_model_config(attn_implementation="sdpa"), tokenizer)
    saved.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    # The architecture fields are ignored when loading: the checkpoint's own config decides.
    cfg = ModelConfig(pretrained=str(tmp_path), dtype="bfloat16", hidden_size=512, num_layers=1)
    model = build_model(cfg, loaded_tokenizer)
    assert model.config._attn_implementation == "legalpt"
    assert model.dtype == torch.bfloat16
    assert count_parameters(model) == count_parameters(saved)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor.to(torch.bfloat16)), name


def test_pretrained_checkpoint_rejects_a_larger_tokenizer(tmp_path, tiny_model_config):
    build_model(tiny_model_config(), make_tokenizer(300)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="embeds only 300"):
        build_model(ModelConfig(pretrained=str(tmp_path)), make_tokenizer(400))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"arch": "gpt2"}, r"model\.arch must be one of llama, mistral, qwen2; got 'gpt2'"),
        ({"sliding_window": 8}, r"model\.sliding_window needs model\.arch mistral or qwen2"),
        ({"arch": "mistral", "sliding_window": 0}, r"model\.sliding_window must be None or >= 1"),
        ({"num_heads": 5}, r"model\.hidden_size must be a multiple of model\.num_heads"),
        ({"num_kv_heads": 3}, r"model\.num_heads must be a multiple of model\.num_kv_heads"),
        ({"num_layers": 0}, r"model\.num_layers must be >= 1"),
        ({"dtype": "float64"}, r"model\.dtype must be one of float32, bfloat16, float16"),
    ],
)
def test_bad_model_config_raises_naming_the_key(overrides, message, tiny_model_config):
    with pytest.raises(ValueError, match=message):
        build_model(tiny_model_config(**overrides), make_tokenizer(300))


def test_forwards_keep_no_cache_unless_asked_and_the_export_generates_with_one(tmp_path, tiny_model_config):
    tokenizer = make_tokenizer(300)
    model = build_model(tiny_model_config(attn_implementation="sdpa"), tokenizer)
    input_ids = torch.randint(4, 300, (1, 12))
    assert model(input_ids=input_ids, labels=input_ids).cache is None
    assert model(input_ids=input_ids, use_cache=True).cache is not None
    generated = model.generate(input_ids, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert generated.cache.get_seq_length() == 12 + 3 - 1  # the last token is sampled, never fed back
    # The export keeps transformers' default: a model loaded from it without legalpt builds a cache.
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["use_cache"] is True
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded(input_ids=input_ids).cache is not None
