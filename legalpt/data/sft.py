"""Supervised fine-tuning data (data.format=sft): prompt/response pairs or chats → token ids with a target mask →
packed rows whose loss falls on the responses alone.

Examples come from `data.paths` (.jsonl/.json, .csv/.tsv, .parquet files, optionally compressed) and `data.sources`
(datasets read through `datasets.load_dataset`: a hub id, a local dataset folder, or a builder with data_files),
concatenated in that order; with neither, from the demo corpus (`legalpt.data.demo.sft`). Each record becomes a chat,
a list of {role, content}: its `data.sft.messages_field` column as it is, else [system,] user = prompt,
assistant = response. The chat is rendered

- with the tokenizer's chat template (`data.sft.template` auto when the tokenizer has one, or chat): an assistant
  turn's tokens are what rendering the chat through that turn adds to rendering the turns before it with the
  generation prompt. They are the targets; everything else is context.
- else with the plain template: [<bos> when data.bos] then, per turn, system "<content>\\n\\n" and user
  "### Instruction:\\n<content>\\n\\n### Response:\\n" (context), assistant "<content>" [+ <eos> when data.eos]
  (targets), and "\\n\\n" (context) between an assistant turn and the next.

Pieces are tokenized one by one and joined, so a target boundary is always a token boundary; the plain template reads
special-token strings in the text as text, a chat template's are its tokens. Examples are packed whole, one segment
each (`legalpt.data.pack.pack_examples`), into rows cached like pretraining's (`legalpt.data.pipeline`). Cleaning and
dedup are steps of pretraining documents and are not applied.

Nothing is dropped silently: a record that cannot become an example (no prompt or response text, malformed
messages, no assistant turn, a chat its template rejects, more tokens than data.seq_len, which is never truncated) is
counted by reason, with example locations, in the report.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import jinja2
import pyarrow.compute as pc
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from legalpt.config import DataConfig, SFTConfig
from legalpt.data.pack import pack_example_dataset
from legalpt.data.pipeline import SPLITS, PreparedData, holds_rows, publishing, split_documents
from legalpt.data.pipeline import cache_key as documents_cache_key
from legalpt.data.readers.rows import SkipReport
from legalpt.data.sources import find_files, open_source
from legalpt.data.tokenizer import get_tokenizer

INSTRUCTION, RESPONSE = "### Instruction:\n", "\n\n### Response:\n"  # the plain template around a user turn
TURN_GAP = "\n\n"  # the plain template between an assistant turn and the next
TOO_LONG = "longer than data.seq_len"  # the skip reason of an example that fits no row
CHAT_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),  # where the record came from: <file or source>:<record number>
        "messages": datasets.Value("string"),  # the chat, JSON [{role, content}, ...]
        "text": datasets.Value("string"),  # its contents joined: what a BPE trained for the run learns from
    }
)
_ENCODED_FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "input_ids": datasets.List(datasets.Value("int32")),  # (tokens,)
        "loss_mask": datasets.List(datasets.Value("int8")),  # (tokens,) 1 on targets
        "skip": datasets.Value("string"),  # why the example is not packed; "" when it is
    }
)
# Builders of datasets.load_dataset by file suffix (a compression suffix after it is read through)
_BUILDERS = {
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"sep": "\t"}),
    ".parquet": ("parquet", {}),
}
_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")


class Unrenderable(Exception):
    """A chat its template cannot render; the message is the skip reason."""


def prepare_sft(cfg: DataConfig, pretrained: str | None = None) -> PreparedData:
    """Load, split, render, tokenize and pack the fine-tuning examples of `cfg` (checked by `pipeline.prepare`,
    which calls this for data.format=sft); `pretrained` names the model whose tokenizer to use."""
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    chats, skipped, read = load_chats(cfg)
    if chats.num_rows == 0:
        where = f"data.paths {list(cfg.paths)}" + (f" and data.sources {list(cfg.sources)}" if cfg.sources else "")
        raise ValueError(f"{where}: no fine-tuning example could be read ({skipped})")
    splits = dict(zip(SPLITS, split_documents(chats, cfg.heldout_fraction, cfg.seed), strict=True))
    seconds["load"] = time.perf_counter() - clock

    clock = time.perf_counter()
    tokenizer = get_tokenizer(cfg, splits["train"], pretrained)
    template = resolve_template(cfg.sft.template, tokenizer, cfg.bos)
    seconds["tokenizer"] = time.perf_counter() - clock

    key = _cache_key(chats, tokenizer, template, cfg)
    folder = Path(cfg.output_dir or Path(cfg.cache_dir) / "packed" / key).expanduser()
    cached = holds_rows(folder, key)
    if not cached:
        _build(folder, key, splits, tokenizer, template, cfg, seconds)
    saved = json.loads((folder / "stats.json").read_text())
    for reason, places in saved["skipped"].items():  # rendering's skips, after loading's
        for where in places["examples"]:
            skipped.add(reason, where)
        skipped.counts[reason] += places["count"] - len(places["examples"])
    if saved["train"]["documents"] == 0:
        raise ValueError(f"data.seq_len: no training example was left to pack in rows of {cfg.seq_len} ({skipped})")
    stats = {
        "format": "sft",
        "skipped": skipped,
        "read": read,
        **{split: saved[split] for split in SPLITS},
        "seq_len": cfg.seq_len,
        "template": template,
        "tokenizer": tokenizer.name_or_path,
        "vocab_size": len(tokenizer),
        "rows_dir": str(folder),
        "cached": cached,
        "seconds": seconds,
    }
    (folder / "report.json").write_text(json.dumps(report(stats), indent=2))
    rows = {split: datasets.load_from_disk(str(folder / split)) for split in SPLITS}
    # The train split's examples (id, text: their contents joined) go into the run's training-documents manifest.
    return PreparedData(rows["train"], rows["heldout"], tokenizer, stats, train_documents=splits["train"])


def report(stats: dict[str, Any]) -> dict[str, Any]:
    """The JSON report of `prepare_sft`'s stats: records read, skipped by reason (with places), kept; per split
    examples, tokens, target tokens, rows, padding."""
    skipped = stats["skipped"]
    return {
        "format": "sft",
        "examples": {
            "read": stats["read"],
            "skipped": skipped.counts,
            "skipped_examples": skipped.examples,
            "kept": sum(stats[split]["documents"] for split in SPLITS),
        },
        "splits": {split: stats[split] for split in SPLITS},
        **{name: stats[name] for name in ("seq_len", "template", "tokenizer", "vocab_size", "cached", "seconds")},
    }


def format_sft_stats(stats: dict[str, Any]) -> str:
    """A short report of `prepare_sft`'s stats for the terminal."""
    train, heldout = stats["train"], stats["heldout"]
    lines = [f"examples   {train['documents']:,} train, {heldout['documents']:,} held-out; {stats['skipped']}"]
    for label, split in (("train", train), ("held-out", heldout)):
        lines.append(
            f"{label:<9}  {split['tokens']:,} tokens ({split['target_tokens']:,} targets) in {split['rows']:,} rows "
            f"of {stats['seq_len']} ({split['padding_pct']:.2f}% padding), longest example "
            f"{split['longest_document']:,} tokens"
        )
    lines.append(f"template   {stats['template']}; tokenizer {stats['tokenizer'] or 'trained BPE'}")
    lines.append(f"rows       {stats['rows_dir']}{' (from cache)' if stats['cached'] else ''}, report.json")
    lines.append("seconds    " + ", ".join(f"{phase} {s:.2f}" for phase, s in stats["seconds"].items()))
    return "\n".join(lines)


def load_chats(cfg: DataConfig) -> tuple[datasets.Dataset, SkipReport, int]:
    """The chats of every record of `cfg`'s examples (`CHAT_FEATURES`), what was skipped, and the records read."""
    skipped, rows, read = SkipReport(), [], 0
    for name, records in _record_sources(cfg, skipped):
        for number, record in enumerate(records):
            read += 1
            where = f"{name}:{number}"
            chat = to_chat(record, cfg.sft)
            if isinstance(chat, str):
                skipped.add(chat, where)
                continue
            text = "\n\n".join(message["content"] for message in chat)
            rows.append({"id": where, "messages": json.dumps(chat, ensure_ascii=False), "text": text})
    return datasets.Dataset.from_list(rows, features=CHAT_FEATURES), skipped, read


def to_chat(record: dict[str, Any], cfg: SFTConfig) -> list[dict[str, str]] | str:
    """The chat of a record: its messages, or [system,] user = prompt, assistant = response; else the reason it has
    none (a skip reason)."""
    messages = record.get(cfg.messages_field)
    if messages is not None:
        return _checked_chat(messages)
    chat = []
    if cfg.system_field and record.get(cfg.system_field) is not None:
        if not isinstance(record[cfg.system_field], str):
            return "no system text"
        chat.append({"role": "system", "content": record[cfg.system_field]})
    for role, field, name in (("user", cfg.prompt_field, "prompt"), ("assistant", cfg.response_field, "response")):
        if not isinstance(record.get(field), str):
            return f"no {name} text"
        chat.append({"role": role, "content": record[field]})
    return _checked_chat(chat)


def _checked_chat(messages: Any) -> list[dict[str, str]] | str:
    """`messages` as a list of {role, content} strings with an assistant turn that has text; else a skip reason."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        return "malformed messages"
    chat = [{"role": m["role"], "content": m["content"]} for m in messages]
    answers = [m["content"] for m in chat if m["role"] == "assistant"]
    if not answers:
        return "no assistant turn"
    if chat[0]["role"] == "assistant":  # a template renders no prompt before it: nothing would predict it
        return "chat starts with an assistant turn"
    if not all(answer.strip() for answer in answers):
        return "empty response"
    return chat


def _record_sources(cfg: DataConfig, skipped: SkipReport) -> Iterator[tuple[str, Iterable[dict[str, Any]]]]:
    """(name, records) of each file of data.paths, then of each source; the demo examples when there are none. A
    source's records past its max_documents are counted as skipped."""
    if not (cfg.paths or cfg.sources):
        from legalpt.data.demo.sft import generate_examples

        yield "demo", generate_examples(cfg.synthetic_documents, cfg.seed)
        return
    for path in find_files(cfg.paths) if cfg.paths else []:
        yield path, read_examples_file(path, "data.paths", cfg.cache_dir)
    for name, source in cfg.sources.items():
        where = f"data.sources.{name}"
        if source.paths:
            parts = [
                (path, read_examples_file(path, f"{where}.paths", cfg.cache_dir)) for path in find_files(source.paths)
            ]
        else:
            parts = [(name, open_source(name, source, cfg))]
        for part, records in parts:
            yield part, _at_most(records, source.max_documents, part, skipped)


def _at_most(records: datasets.Dataset, limit: int, name: str, skipped: SkipReport) -> Iterable[dict[str, Any]]:
    if not limit or records.num_rows <= limit:
        return records
    for number in range(limit, records.num_rows):
        skipped.add("beyond max_documents", f"{name}:{number}")
    return records.select(range(limit))


def read_examples_file(path: str, key: str, cache_dir: str) -> datasets.Dataset:
    """The records of one file of examples, read by the `datasets` builder of its suffix; `key` is the setting that
    named it (for the error of an unknown or unreadable file)."""
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    if suffixes and suffixes[-1] in _COMPRESSIONS:
        suffixes = suffixes[:-1]
    if not suffixes or suffixes[-1] not in _BUILDERS:
        raise ValueError(
            f"{key}: {path!r} is not a file of examples; expected {', '.join(_BUILDERS)} (data.format=sft)"
        )
    builder, options = _BUILDERS[suffixes[-1]]
    try:
        return datasets.load_dataset(
            builder,
            data_files=[path],
            split="train",
            cache_dir=str(Path(cache_dir).expanduser() / "datasets"),
            **options,
        )
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError) as error:
        raise ValueError(f"{key}: cannot read {path!r} as {builder}: {error}") from error


def resolve_template(setting: str, tokenizer: PreTrainedTokenizerFast, bos: bool = False) -> str:
    """chat or plain: the template `data.sft.template` asks for with this tokenizer; `bos` (data.bos) needs the
    tokenizer's bos token for the plain template."""
    if setting == "auto":
        setting = "chat" if tokenizer.chat_template else "plain"
    if setting == "chat" and not tokenizer.chat_template:
        raise ValueError(
            f"data.sft.template: chat, but tokenizer {tokenizer.name_or_path!r} has no chat template; "
            "expected auto or plain"
        )
    if bos and setting == "plain" and tokenizer.bos_token_id is None:
        raise ValueError(f"data.bos: tokenizer {tokenizer.name_or_path!r} has no bos token to start examples with")
    return setting


def render(
    chat: list[dict[str, str]],
    tokenizer: PreTrainedTokenizerFast,
    template: str,
    bos_id: int | None = None,
    eos_id: int | None = None,
) -> list[tuple[str | list[int], bool]]:
    """The chat as pieces (text, or token ids) in order, each marked whether it is a target; raises Unrenderable.
    `bos_id`, `eos_id` (None = none) are the plain template's; a chat template places its own."""
    if template == "chat":
        return _chat_pieces(chat, tokenizer)
    pieces: list[tuple[str | list[int], bool]] = [([bos_id], False)] if bos_id is not None else []
    for number, message in enumerate(chat):
        role, content = message["role"], message["content"]
        if role == "system":
            pieces.append((content + "\n\n", False))
        elif role == "user":
            pieces.append((INSTRUCTION + content + RESPONSE, False))
        elif role == "assistant":
            pieces += [(content, True), *([([eos_id], True)] if eos_id is not None else [])]
            if number + 1 < len(chat):
                pieces.append((TURN_GAP, False))
        else:
            raise Unrenderable("role outside the plain template")
    return pieces


def _chat_pieces(chat: list[dict[str, str]], tokenizer: PreTrainedTokenizerFast) -> list[tuple[str, bool]]:
    def rendered(messages: list[dict[str, str]], generation_prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        except jinja2.exceptions.TemplateError as error:  # the template's raise_exception: roles out of order, ...
            raise Unrenderable("chat template error") from error

    pieces, done = [], ""
    for number, message in enumerate(chat):
        if message["role"] == "assistant":
            prompt, through = rendered(chat[:number], True), rendered(chat[: number + 1], False)
            _check_prefix(done, prompt)
            _check_prefix(prompt, through)
            pieces += [(prompt[len(done) :], False), (through[len(prompt) :], True)]
            done = through
    whole = rendered(chat, False)
    _check_prefix(done, whole)
    pieces.append((whole[len(done) :], False))
    return [(text, target) for text, target in pieces if text]


def _check_prefix(prefix: str, text: str) -> None:
    if not text.startswith(prefix):
        raise ValueError(
            "data.sft.template: the tokenizer's chat template renders earlier turns differently once later ones "
            f"follow ({prefix[-60:]!r} is not continued by {text[-60:]!r}), so its assistant tokens cannot be "
            "found; expected a template whose renderings extend each other, or data.sft.template=plain"
        )


def encode_examples(
    batch: dict[str, list], tokenizer: PreTrainedTokenizerFast, backend: Tokenizer, template: str, cfg: DataConfig
) -> dict[str, list]:
    """Token ids and loss masks of a batch of chats ({id, messages, ...} → `_ENCODED_FEATURES`); an example that
    cannot be rendered, or is longer than data.seq_len, gets a skip reason and no tokens."""
    # The plain template reads special-token strings in the text as text; a chat template's markup is its tokens.
    backend.encode_special_tokens = template == "plain"  # set per call: the setting does not survive pickling
    bos_id = tokenizer.bos_token_id if cfg.bos else None
    eos_id = tokenizer.eos_token_id if cfg.eos else None
    out: dict[str, list] = {"id": batch["id"], "input_ids": [], "loss_mask": [], "skip": []}
    for messages in batch["messages"]:
        try:
            ids, mask = tokenize(render(json.loads(messages), tokenizer, template, bos_id, eos_id), backend)
            skip = TOO_LONG if len(ids) > cfg.seq_len else "" if any(mask) else "no response tokens"
        except Unrenderable as error:
            skip = str(error)
        out["input_ids"].append([] if skip else ids)
        out["loss_mask"].append([] if skip else mask)
        out["skip"].append(skip)
    return out


def tokenize(pieces: list[tuple[str | list[int], bool]], backend: Tokenizer) -> tuple[list[int], list[int]]:
    """Token ids of rendered pieces, each text piece tokenized on its own, and per id 1 if its piece is a target."""
    texts = [piece for piece, _ in pieces if isinstance(piece, str)]
    encodings = iter(backend.encode_batch_fast(texts, add_special_tokens=False))
    ids, mask = [], []
    for piece, target in pieces:
        piece_ids = piece if isinstance(piece, list) else next(encodings).ids
        ids += piece_ids
        mask += [int(target)] * len(piece_ids)
    return ids, mask


def _cache_key(chats: datasets.Dataset, tokenizer: PreTrainedTokenizerFast, template: str, cfg: DataConfig) -> str:
    """Pretraining's key of the chats' texts (tokenizer, split, seq_len, packing code), extended by what rendering
    adds: the chats themselves, the template, and this module's code."""
    digest = hashlib.sha256(documents_cache_key(chats, tokenizer, cfg).encode())
    for batch in chats.iter(batch_size=1024):
        for where, messages in zip(batch["id"], batch["messages"], strict=True):
            digest.update(json.dumps([where, messages]).encode())
    digest.update(json.dumps([template, tokenizer.chat_template if template == "chat" else None]).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _build(
    folder: Path,
    key: str,
    splits: dict[str, datasets.Dataset],
    tokenizer: PreTrainedTokenizerFast,
    template: str,
    cfg: DataConfig,
    seconds: dict[str, float],
) -> None:
    """Encode and pack both splits into `folder`, built aside and renamed into place so it is never half written;
    stats.json keeps each split's stats and the skips of encoding."""
    with publishing(folder, key) as (work, out):
        saved: dict[str, Any] = {"key": key, "skipped": {}}
        seconds["tokenize"] = seconds["pack"] = 0.0
        for split, chats in splits.items():
            clock = time.perf_counter()
            cache_file, fingerprint = work / f"{split}-examples.arrow", f"{key}-{split}"
            kept = encode_chats(chats, tokenizer, template, cfg, (cache_file, fingerprint), saved["skipped"])
            seconds["tokenize"] += time.perf_counter() - clock

            clock = time.perf_counter()
            rows, stats = pack_example_dataset(kept, cfg.seq_len, tokenizer.pad_token_id, str(work))
            rows.save_to_disk(str(out / split), num_shards=None if rows.num_rows else 1)  # load_from_disk needs one
            targets = pc.sum(pc.list_flatten(kept.with_format("arrow")["loss_mask"])).as_py() if kept.num_rows else 0
            saved[split] = {**stats.to_dict(), "target_tokens": targets or 0}
            seconds["pack"] += time.perf_counter() - clock
        (out / "stats.json").write_text(json.dumps(saved))


def encode_chats(
    chats: datasets.Dataset,
    tokenizer: PreTrainedTokenizerFast,
    template: str,
    cfg: DataConfig,
    cache: tuple[Path, str],
    skipped: dict[str, dict[str, Any]],
) -> datasets.Dataset:
    """The examples of `chats` that encode (id, input_ids, loss_mask), written to `cache` (a file, and a fingerprint
    that names what the encoding depends on); each one that does not is counted in `skipped` ({reason: {count,
    examples: its first places}})."""
    encoded = _encode(chats, tokenizer, template, cfg, *cache)
    reasons = encoded.data.column("skip").to_pylist()
    for where, reason in zip(encoded.data.column("id").to_pylist(), reasons, strict=True):
        if reason:
            place = skipped.setdefault(reason, {"count": 0, "examples": []})
            place["count"] += 1
            if len(place["examples"]) < SkipReport.max_examples:
                place["examples"].append(where)
    return encoded.select([i for i, reason in enumerate(reasons) if not reason])


def _encode(
    chats: datasets.Dataset,
    tokenizer: PreTrainedTokenizerFast,
    template: str,
    cfg: DataConfig,
    cache_file: Path,
    fingerprint: str,
) -> datasets.Dataset:
    if chats.num_rows == 0:  # map() skips an empty dataset, and would return it without the new columns
        return datasets.Dataset.from_dict({name: [] for name in _ENCODED_FEATURES}, features=_ENCODED_FEATURES)
    return chats.map(
        encode_examples,
        batched=True,
        batch_size=256,
        num_proc=cfg.num_proc if cfg.num_proc > 1 else None,
        remove_columns=chats.column_names,
        features=_ENCODED_FEATURES,
        fn_kwargs={
            "tokenizer": tokenizer,
            "backend": copy.deepcopy(tokenizer.backend_tokenizer),  # a copy: encode_examples changes a setting
            "template": template,
            "cfg": cfg,
        },
        cache_file_name=str(cache_file),
        new_fingerprint=fingerprint,
        desc="encoding examples",
    )
