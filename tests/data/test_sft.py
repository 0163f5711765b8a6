"""Fine-tuning data: chats from records, plain and chat-template rendering against independent tokenizations (HF's
own assistant mask for a chat template), whole-example packing, loss masks in labels, files read and skips counted."""

import copy
import json
import random

import pandas as pd
import pytest

from legalpt.config import ConfigError, DataConfig, SFTConfig, compose, to_config
from legalpt.data.pack import IGNORE_INDEX, collate_packed, pack_examples
from legalpt.data.pipeline import prepare
from legalpt.data.sft import INSTRUCTION, RESPONSE, TOO_LONG, render, to_chat, tokenize
from legalpt.data.tokenizer import train_bpe

WORDS = [
    "the",
    "parties",
    "agree",
    "court",
    "held",
    "contract",
    "clause",
    "breach",
    "damages",
    "notice",
    "term",
    "seller",
    "buyer",
    "shall",
]
# ChatML with generation markers around what an assistant turn adds, so that transformers' own
# return_assistant_tokens_mask serves as the reference.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def tokenizer():
    texts = [sentence(random.Random(i), 40) + "\n### Instruction: Response:" for i in range(50)]
    return train_bpe(texts, 400)


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer):
    chatml = copy.deepcopy(tokenizer)
    chatml.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chatml.chat_template = CHATML
    return chatml


def hf_ids(tokenizer, text: str) -> list[int]:
    """transformers' tokenization of text read as text (special-token strings included)."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def test_plain_template_targets_exactly_the_response_and_eos(rng, tokenizer):
    prompt, response = sentence(rng, 12), sentence(rng, 7) + " <|endoftext|> " + sentence(rng, 3)
    chat = to_chat({"prompt": prompt, "response": response}, SFTConfig())
    ids, mask = tokenize(render(chat, tokenizer, "plain", None, tokenizer.eos_token_id), _backend(tokenizer, True))

    context = hf_ids(tokenizer, INSTRUCTION + prompt + RESPONSE)
    target = [*hf_ids(tokenizer, response), tokenizer.eos_token_id]  # the eos string in the text is text
    assert ids == context + target
    assert mask == [0] * len(context) + [1] * len(target)
    assert ids.count(tokenizer.eos_token_id) == 1


def test_plain_template_places_system_bos_and_later_turns(rng, tokenizer):
    system, turns = sentence(rng, 4), [sentence(rng, 5) for _ in range(4)]
    chat = [{"role": "system", "content": system}]
    chat += [{"role": role, "content": text} for role, text in zip(["user", "assistant"] * 2, turns, strict=True)]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids, mask = tokenize(render(chat, tokenizer, "plain", bos, eos), _backend(tokenizer, True))

    pieces = [
        ([bos], 0),
        (hf_ids(tokenizer, system + "\n\n" + INSTRUCTION + turns[0] + RESPONSE), 0),
        ([*hf_ids(tokenizer, turns[1]), eos], 1),
        (hf_ids(tokenizer, "\n\n" + INSTRUCTION + turns[2] + RESPONSE), 0),
        ([*hf_ids(tokenizer, turns[3]), eos], 1),
    ]
    assert ids == [t for piece, _ in pieces for t in piece]
    assert mask == [flag for piece, flag in pieces for _ in piece]


def test_chat_template_targets_match_transformers_assistant_mask(rng, chat_tokenizer):
    chat = [{"role": "system", "content": sentence(rng, 4)}]
    for _ in range(3):
        chat += [{"role": "user", "content": sentence(rng, 6)}, {"role": "assistant", "content": sentence(rng, 5)}]
    ids, mask = tokenize(render(chat, chat_tokenizer, "chat"), _backend(chat_tokenizer, False))

    reference = chat_tokenizer.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
    assert ids == reference["input_ids"]
    assert mask == reference["assistant_masks"]
    assert sum(mask) > 3 * 5  # each answer and its end-of-turn token


def test_chat_template_that_rewrites_earlier_turns_is_an_error(chat_tokenizer):
    rewriting = copy.deepcopy(chat_tokenizer)
    rewriting.chat_template = CHATML.replace("{% endfor %}", "{% if loop.last %}[end]{% endif %}{% endfor %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    with pytest.raises(ValueError, match=r"^data\.sft\.template: .*renders earlier turns differently"):
        render(chat, rewriting, "chat")


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"prompt": "q"}, "no response text"),
        ({"response": "a"}, "no prompt text"),
        ({"prompt": "q", "response": 3}, "no response text"),
        ({"prompt": "q", "response": "  "}, "empty response"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant turn"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "chat starts with an assistant turn"),
        ({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}, "malformed messages"),
        ({"messages": "user: q"}, "malformed messages"),
    ],
)
def test_records_without_an_example_give_their_reason(record, reason):
    assert to_chat(record, SFTConfig()) == reason


def test_columns_are_configurable():
    cfg = SFTConfig(prompt_field="question", response_field="answer", system_field="persona")
    chat = to_chat({"question": "q", "answer": "a", "persona": "p"}, cfg)
    assert chat == [
        {"role": "system", "content": "p"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def random_examples(rng: random.Random, seq_len: int) -> list[tuple[list[int], list[int]]]:
    lengths = [rng.randint(1, seq_len) for _ in range(rng.randint(10, 40))] + [seq_len, 1]
    rng.shuffle(lengths)
    # ids from [3, 10**6): all distinct with high probability, so each example is recognisable in the rows
    return [([rng.randrange(3, 10**6) for _ in range(n)], [rng.randint(0, 1) for _ in range(n)]) for n in lengths]


@pytest.mark.parametrize("seq_len", [2, 9, 64])
def test_pack_examples_keeps_every_example_whole_once(rng, seq_len):
    examples = random_examples(rng, seq_len)
    rows = list(pack_examples(examples, seq_len, pad_id=2, open_rows=4))

    segments = []
    for row in rows:
        assert len(row["input_ids"]) == len(row["loss_mask"]) == sum(row["seq_lens"]) == seq_len
        assert row["context_lens"] == [0] * len(row["seq_lens"])
        content = seq_len - row["num_pad"]
        assert row["input_ids"][content:] == [2] * row["num_pad"] and not any(row["loss_mask"][content:])
        start = 0
        for length in row["seq_lens"][: len(row["seq_lens"]) - (row["num_pad"] > 0)]:
            segments.append((row["input_ids"][start : start + length], row["loss_mask"][start : start + length]))
            start += length
        assert start == content
    assert sorted(segments) == sorted(examples)
    # First fit never opens a row that an earlier open one could take: fewer rows than one example per row, and at
    # most as many as laying examples end to end in order with a new row whenever the next does not fit.
    in_order, used = 1, 0
    for ids, _ in examples:
        in_order, used = (in_order + 1, len(ids)) if used + len(ids) > seq_len else (in_order, used + len(ids))
    assert len(rows) <= in_order


def test_pack_examples_refuses_an_example_longer_than_a_row():
    with pytest.raises(ValueError, match=r"examples\[1\]: expected 1 to 4 ids"):
        list(pack_examples([([5], [1]), ([5] * 5, [1] * 5)], seq_len=4, pad_id=0))


def test_collate_labels_only_masked_tokens_that_do_not_start_a_segment(rng):
    rows = list(pack_examples(random_examples(rng, 16), 16, pad_id=2))
    batch = collate_packed(rows)

    expected = []
    for row in rows:
        start = 0
        for length in row["seq_lens"]:
            for i in range(start, start + length):
                keep = row["loss_mask"][i] and i > start
                expected.append(row["input_ids"][i] if keep else IGNORE_INDEX)
            start += length
    assert batch["labels"][0].tolist() == expected
    with pytest.raises(ValueError, match="loss_mask in every row or in none"):
        collate_packed([rows[0], {k: v for k, v in rows[0].items() if k != "loss_mask"}])


def test_prepare_reads_jsonl_csv_parquet_and_counts_every_skip(tmp_path, rng):
    pairs = [{"prompt": sentence(rng, 8), "response": sentence(rng, 4)} for _ in range(9)]
    (tmp_path / "a.jsonl").write_text(
        "\n".join(
            json.dumps(p)
            for p in [*pairs[:3], {"prompt": "no answer"}, {"prompt": "x", "response": sentence(rng, 400)}]
        )
    )
    pd.DataFrame(pairs[3:6]).to_csv(tmp_path / "b.csv", index=False)
    chats = [
        [{"role": "user", "content": p["prompt"]}, {"role": "assistant", "content": p["response"]}] for p in pairs[6:]
    ]
    pd.DataFrame({"messages": chats}).to_parquet(tmp_path / "c.parquet")
    overrides = [f"data.paths=[{tmp_path}/a.jsonl,{tmp_path}/b.csv,{tmp_path}/c.parquet]", "data.heldout_fraction=0.2"]
    cfg = to_config(compose("prepare", sft_overrides(tmp_path, *overrides))).data

    data = prepare(cfg)
    report = json.loads((tmp_path / "rows" / "report.json").read_text())
    assert report["examples"]["read"] == 11
    assert report["examples"]["skipped"] == {"no response text": 1, TOO_LONG: 1}
    assert report["examples"]["skipped_examples"][TOO_LONG] == [f"{tmp_path / 'a.jsonl'}:4"]
    assert report["examples"]["kept"] == 9
    assert data.stats["train"]["documents"] + data.stats["heldout"]["documents"] == 9
    # Every kept example's response, and nothing else, is a target: the targets of all rows decode to the responses.
    rows = [*data.train, *data.heldout]
    targets = [data.tokenizer.decode(_targets(row)) for row in rows]
    eos = data.tokenizer.eos_token
    assert sorted(t for text in targets for t in text.split(eos) if t) == sorted(p["response"] for p in pairs)
    assert prepare(cfg).stats["cached"]


def test_an_unknown_file_of_examples_is_named(tmp_path):
    (tmp_path / "notes.txt").write_text("prompt: q")
    cfg = to_config(compose("prepare", sft_overrides(tmp_path, f"data.paths=[{tmp_path / 'notes.txt'}]"))).data
    with pytest.raises(ValueError, match=r"^data\.paths: .*notes\.txt' is not a file of examples; expected \.jsonl"):
        prepare(cfg)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.format=chat", "data.format: expected one of text, sft"),
        ("data.sft.template=jinja", "data.sft.template: expected one of auto, chat, plain"),
        ("data.sft.prompt_field=''", "data.sft.prompt_field: expected a column name"),
        ("data.streaming=true", "data.streaming: expected False with data.format=sft"),
        ("data.chunk_overlap=8", "data.chunk_overlap: expected 0 with data.format=sft"),
    ],
)
def test_config_refuses_what_fine_tuning_cannot_do(tmp_path, override, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        to_config(compose("prepare", sft_overrides(tmp_path, override)))


def test_demo_examples_train_without_any_file(tmp_path):
    cfg = DataConfig(format="sft", synthetic_documents=6, seq_len=1024, vocab_size=300, cache_dir=str(tmp_path))
    data = prepare(cfg)
    assert data.stats["train"]["documents"] + data.stats["heldout"]["documents"] == 6
    assert data.stats["template"] == "plain" and data.stats["train"]["target_tokens"] > 0


def sft_overrides(tmp_path, *extra: str) -> list[str]:
    return [
        "data.format=sft",
        "data.seq_len=256",  # each word is at least one token: 400 words do not fit
        "data.vocab_size=300",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"data.output_dir={tmp_path / 'rows'}",
        *extra,
    ]


def _targets(row: dict) -> list[int]:
    return [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]


def _backend(tokenizer, special_strings_as_text: bool):
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.encode_special_tokens = special_strings_as_text
    return backend


def test_prepare_renders_chats_with_the_tokenizers_template(tmp_path, rng, chat_tokenizer):
    chat_tokenizer.save_pretrained(tmp_path / "chatml")
    chats = []
    for _ in range(6):
        turns = rng.randint(1, 3)
        chat = [{"role": "system", "content": sentence(rng, 3)}] if rng.random() < 0.5 else []
        for _ in range(turns):
            chat += [{"role": "user", "content": sentence(rng, 5)}, {"role": "assistant", "content": sentence(rng, 4)}]
        chats.append(chat)
    (tmp_path / "chats.jsonl").write_text("\n".join(json.dumps({"messages": chat}) for chat in chats))
    overrides = [f"data.paths=[{tmp_path / 'chats.jsonl'}]", f"data.tokenizer={tmp_path / 'chatml'}"]
    data = prepare(to_config(compose("prepare", sft_overrides(tmp_path, *overrides))).data)

    assert data.stats["template"] == "chat"
    expected = {}
    for chat in chats:
        reference = chat_tokenizer.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
        expected[tuple(reference["input_ids"])] = reference["assistant_masks"]
    found = []
    for row in [*data.train, *data.heldout]:
        start = 0
        for length in row["seq_lens"][: len(row["seq_lens"]) - (row["num_pad"] > 0)]:
            segment = tuple(row["input_ids"][start : start + length])
            assert row["loss_mask"][start : start + length] == expected[segment]
            found.append(segment)
            start += length
    assert sorted(found) == sorted(expected)
