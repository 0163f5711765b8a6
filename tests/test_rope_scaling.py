"""RoPE scaling (`model.rope_scaling`) for new models and checkpoints, and the check of data.seq_len against the
positions a model covers.

The reference rotary embeddings are written here from each method's own definition (linear position interpolation,
dynamic NTK, Meta's llama3 `apply_scaling`, YaRN's reference code), from the legalpt config's values: they share no
code with transformers, which computes the model's.
"""

import json
import math

import pytest
import torch
from test_model import make_tokenizer

from legalpt.config import ConfigError, RopeScalingConfig, compose, to_config
from legalpt.model import build_model, max_positions

TRAINED = 64  # max_position_embeddings of the models below
THETA = 5000.0
HEAD_DIM = 16  # the tiny preset: hidden 64 over 4 heads


def inverse_frequencies(theta: float, dim: int = HEAD_DIM) -> torch.Tensor:
    """Unscaled RoPE: one frequency per pair of dimensions, theta^(-2i/dim), float64."""
    return theta ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def linear(inv: torch.Tensor, factor: float, **_) -> tuple[torch.Tensor, float]:
    return inv / factor, 1.0


def dynamic(inv: torch.Tensor, factor: float, seq_len: int, **_) -> tuple[torch.Tensor, float]:
    """NTK-aware: the base grows once the sequence passes the trained length."""
    length = max(seq_len, TRAINED)
    base = THETA * (factor * length / TRAINED - (factor - 1)) ** (HEAD_DIM / (HEAD_DIM - 2))
    return inverse_frequencies(base), 1.0


def llama3(inv, factor, original, low_freq_factor, high_freq_factor, **_) -> tuple[torch.Tensor, float]:
    """Long wavelengths divided by the factor, short ones kept, a smooth blend between."""
    wavelength = 2 * math.pi / inv
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv / factor + smooth * inv
    scaled = torch.where(wavelength > original / low_freq_factor, inv / factor, blended)
    return torch.where(wavelength < original / high_freq_factor, inv, scaled), 1.0


def yarn(inv, factor, original, beta_fast, beta_slow, attention_factor, **_) -> tuple[torch.Tensor, float]:
    """Dimensions turning more than beta_fast times over the trained context kept, fewer than beta_slow interpolated,
    a linear ramp over the dimension index between; cos and sin scaled by 0.1 ln(factor) + 1 unless given."""

    def dimension(rotations: float) -> float:  # the pair index that turns `rotations` times over `original`
        return HEAD_DIM * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low = max(math.floor(dimension(beta_fast)), 0)
    high = min(math.ceil(dimension(beta_slow)), HEAD_DIM - 1)
    ramp = ((torch.arange(HEAD_DIM // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    scale = attention_factor if attention_factor is not None else 0.1 * math.log(factor) + 1
    return inv / factor * ramp + inv * (1 - ramp), scale


REFERENCES = {"linear": linear, "dynamic": dynamic, "llama3": llama3, "yarn": yarn}
SCALINGS = [
    RopeScalingConfig(type="linear", factor=4.0),
    RopeScalingConfig(type="dynamic", factor=4.0),
    RopeScalingConfig(type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0),
    RopeScalingConfig(type="llama3", factor=4.0, original_max_position_embeddings=32, low_freq_factor=2.0),
    RopeScalingConfig(type="yarn", factor=4.0),
    RopeScalingConfig(type="yarn", factor=2.0, beta_fast=16.0, beta_slow=2.0, attention_factor=1.3),
]


def reference_cos_sin(scaling: RopeScalingConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(seq_len, HEAD_DIM) cos and sin of positions 0..seq_len-1 under `scaling`, float32 as transformers returns."""
    inv, scale = REFERENCES[scaling.type](
        inverse_frequencies(THETA),
        factor=scaling.factor,
        seq_len=seq_len,
        original=scaling.original_max_position_embeddings or TRAINED,
        low_freq_factor=scaling.low_freq_factor,
        high_freq_factor=scaling.high_freq_factor,
        beta_fast=scaling.beta_fast,
        beta_slow=scaling.beta_slow,
        attention_factor=scaling.attention_factor,
    )
    angles = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv.float()[None]  # (S, HEAD_DIM / 2)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos() * scale, angles.sin() * scale


def model_cos_sin(model, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(1, seq_len, model.config.hidden_size)
    cos, sin = model.model.rotary_emb(x, torch.arange(seq_len)[None])
    return cos[0], sin[0]


def assert_rope_matches(model, scaling: RopeScalingConfig) -> None:
    seq_len = 4 * TRAINED  # past the trained context, where dynamic NTK starts stretching
    for ours, expected in zip(model_cos_sin(model, seq_len), reference_cos_sin(scaling, seq_len), strict=True):
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.fixture
def tiny(tiny_model_config):
    """The tiny preset trained at TRAINED positions with base THETA, other fields overridden."""
    return lambda **overrides: tiny_model_config(
        **{"max_position_embeddings": TRAINED, "rope_theta": THETA, **overrides}
    )


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.type)
def test_new_model_rope_matches_the_methods_definition(scaling, tiny):
    model = build_model(tiny(rope_scaling=scaling), make_tokenizer(300))
    assert_rope_matches(model, scaling)


def test_reference_tells_the_scalings_apart(tiny):
    """The references differ from one another and from plain RoPE, so each comparison above can fail."""
    plain = model_cos_sin(build_model(tiny(), make_tokenizer(300)), 4 * TRAINED)[0]
    curves = [reference_cos_sin(scaling, 4 * TRAINED)[0] for scaling in SCALINGS]
    for i, curve in enumerate(curves):
        assert (curve - plain).abs().max() > 1e-2, SCALINGS[i]
        for other in curves[:i]:
            assert (curve - other).abs().max() > 1e-2, SCALINGS[i]


def test_max_position_embeddings_of_a_scaled_new_model(tiny):
    yarn = RopeScalingConfig(type="yarn", factor=4.0)
    assert build_model(tiny(rope_scaling=yarn), make_tokenizer(300)).config.max_position_embeddings == 4 * TRAINED
    assert max_positions(tiny(rope_scaling=yarn))[0] == 4 * TRAINED
    # The original context defaults to max_position_embeddings ...
    assert max_positions(tiny(max_position_embeddings=1024, rope_scaling=yarn))[0] == 4096
    # ... and max_position_embeddings may be raised past factor x original (as Llama 3.1's is)
    llama3 = RopeScalingConfig(type="llama3", factor=2.0, original_max_position_embeddings=TRAINED)
    assert max_positions(tiny(max_position_embeddings=1024, rope_scaling=llama3))[0] == 1024
    # dynamic NTK keeps the trained length as max_position_embeddings: it stretches past it
    dynamic = build_model(tiny(rope_scaling=RopeScalingConfig(type="dynamic", factor=4.0)), make_tokenizer(300))
    assert dynamic.config.max_position_embeddings == TRAINED
    assert max_positions(tiny(rope_scaling=RopeScalingConfig(type="dynamic", factor=4.0)))[0] == 4 * TRAINED


@pytest.fixture
def checkpoint(tmp_path, tiny):
    """A saved tiny model with plain RoPE at TRAINED positions and base THETA."""
    build_model(tiny(attn_implementation="sdpa"), make_tokenizer(300)).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s.type)
def test_scaling_overrides_a_checkpoints_rope(scaling, checkpoint, tiny, tmp_path):
    # The architecture fields are the checkpoint's; its rope_theta stays, the small preset's does not apply.
    cfg = tiny(pretrained=str(checkpoint), rope_theta=10000.0, max_position_embeddings=4096, rope_scaling=scaling)
    model = build_model(cfg, make_tokenizer(300))
    assert_rope_matches(model, scaling)
    # The continued model is exported with its scaling, so it loads as it was trained.
    model.save_pretrained(tmp_path / "export")
    saved = json.loads((tmp_path / "export" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == scaling.type
    assert saved["rope_parameters"]["factor"] == scaling.factor


def test_checkpoint_without_scaling_keeps_its_rope(checkpoint, tiny):
    model = build_model(tiny(pretrained=str(checkpoint), max_position_embeddings=4096), make_tokenizer(300))
    assert model.config.rope_parameters == {"rope_type": "default", "rope_theta": THETA}
    assert model.config.max_position_embeddings == TRAINED
    assert max_positions(tiny(pretrained=str(checkpoint), max_position_embeddings=4096))[0] == TRAINED


def train_config(*overrides: str):
    return to_config(compose("train", ["model=tiny", "data.synthetic_documents=4", *overrides]))


def test_seq_len_past_a_new_models_positions_names_both():
    with pytest.raises(ConfigError, match=r"^data\.seq_len: expected at most 2048 \(model\.max_position_embeddings.*"
                       r"model\.rope_scaling\), got 4096$"):  # fmt: skip
        train_config("data.seq_len=4096")
    train_config("data.seq_len=2048")
    train_config("data.seq_len=4096", "model.max_position_embeddings=4096")
    train_config("data.seq_len=4096", "model.rope_scaling.type=linear", "model.rope_scaling.factor=2")


def test_seq_len_past_a_checkpoints_positions_names_both(checkpoint):
    pretrained = f"model.pretrained={checkpoint}"
    with pytest.raises(ConfigError, match=rf"^data\.seq_len: expected at most {TRAINED} \(max_position_embeddings "
                       r"of model\.pretrained=.*, got 128$"):  # fmt: skip
        train_config(pretrained, "data.seq_len=128")
    yarn = ["model.rope_scaling.type=yarn", "model.rope_scaling.factor=1.5"]
    with pytest.raises(ConfigError, match=rf"^data\.seq_len: expected at most 96 \(model\.rope_scaling\.factor 1\.5 x "
                       rf"{TRAINED}.*, got 128$"):  # fmt: skip
        train_config(pretrained, "data.seq_len=128", *yarn)
    train_config(pretrained, "data.seq_len=128", "model.rope_scaling.type=yarn", "model.rope_scaling.factor=2")


def test_seq_len_is_checked_before_data_preparation(monkeypatch):
    import legalpt.train.trainer as trainer

    monkeypatch.setattr(trainer, "prepare", lambda *args: pytest.fail("data prepared"))
    with pytest.raises(ConfigError, match=r"^data\.seq_len"):
        trainer.train(compose("train", ["model=tiny", "data.seq_len=4096", "logger=none"]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["type=ntk"], r"model\.rope_scaling\.type: expected one of none, linear, dynamic, llama3, yarn, got 'ntk'"),
        (["type=linear", "factor=0.5"], r"model\.rope_scaling\.factor: expected a finite number >= 1, got 0\.5"),
        (["type=yarn", "factor=2", "original_max_position_embeddings=0"],
         r"model\.rope_scaling\.original_max_position_embeddings: expected None or an integer >= 1, got 0"),
        (["type=llama3", "factor=2", "low_freq_factor=4", "high_freq_factor=2"],
         r"model\.rope_scaling\.high_freq_factor: expected a number > model\.rope_scaling\.low_freq_factor"),
        (["type=yarn", "factor=2", "beta_fast=1", "beta_slow=2"],
         r"model\.rope_scaling\.beta_fast: expected a number > model\.rope_scaling\.beta_slow"),
        (["type=yarn", "factor=2", "attention_factor=0"],
         r"model\.rope_scaling\.attention_factor: expected a finite number > 0, got 0\.0"),
    ],
)  # fmt: skip
def test_bad_rope_scaling_is_named_by_its_key(overrides, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        train_config(*(f"model.rope_scaling.{o}" for o in overrides))
