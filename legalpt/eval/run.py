"""`legalpt-eval`: perplexity, citation accuracy, citation sets, multiple choice and lm-evaluation-harness tasks
(`legalpt.eval.harness`) for one checkpoint or two.

With no arguments it evaluates the newest run's HF export (under `eval.runs_dir`) on the held-out documents of the
configured corpus — the demo corpus by default, split exactly as training split it — or, with `eval.documents=all`,
on every document of it. Either way no document a checkpoint was trained on is scored: the training-documents
manifest of its run (`legalpt.data.manifest`) names them, and they are left out and counted. The eval set (citation
prompts with their gold citations, and the opinions to continue) is built once from text, written to
`eval_set.jsonl`, and used for every checkpoint, so a comparison (`eval.compare=...`) scores both models on the same
items; pass `eval.eval_set=<that file>` to reuse it in a later run. With data.format=sft the data are fine-tuning
examples instead, split and left out the same way, and `response_loss` scores the loss on their responses.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from omegaconf import DictConfig, OmegaConf
from transformers import AutoTokenizer

from legalpt.config import EVAL_TASKS, Config, DataConfig, EvalConfig, to_config
from legalpt.data.clean import clean_text
from legalpt.data.manifest import MANIFEST, TrainingDocuments
from legalpt.data.pipeline import split_corpus
from legalpt.data.readers.rows import SkipReport
from legalpt.data.stream import in_heldout, skip_reason, stream_records
from legalpt.eval import choice, citations, harness, responses
from legalpt.eval.generate import generate, generate_with_stats
from legalpt.eval.perplexity import document_perplexity
from legalpt.eval.report import write_report
from legalpt.model import build_model
from legalpt.runtime import EXPORT_DIR, export_dir, log_on_main_process_only, mixed_precision

log = logging.getLogger(__name__)
DOCUMENT_TASKS = ("perplexity", "citations", "citation_set")  # the tasks scored on the corpus's documents


@dataclasses.dataclass
class EvalSet:
    """Everything scored, as text: the same for every checkpoint of a run and reusable across runs."""

    citation_items: list[citations.CitationItem]
    set_items: list[citations.SetItem]
    stats: dict

    def save(self, path: Path) -> None:
        with path.open("w") as f:
            f.write(json.dumps({"type": "stats", **self.stats}) + "\n")
            for item in self.citation_items:
                f.write(json.dumps({"type": "citation", **item.to_dict()}) + "\n")
            for item in self.set_items:
                f.write(json.dumps({"type": "citation_set", **item.to_dict()}) + "\n")

    @classmethod
    def load(cls, path: Path) -> EvalSet:
        if not path.is_file():
            raise FileNotFoundError(f"eval.eval_set={str(path)!r}: no such file (an eval_set.jsonl of an earlier run)")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        by_type: dict[str, list[dict]] = {"stats": [], "citation": [], "citation_set": []}
        for record in records:
            by_type[record.pop("type")].append(record)
        return cls(
            citation_items=[citations.CitationItem.from_dict(r) for r in by_type["citation"]],
            set_items=[citations.SetItem.from_dict(r) for r in by_type["citation_set"]],
            stats=by_type["stats"][0] if by_type["stats"] else {},
        )


class CheckpointError(FileNotFoundError):
    """A checkpoint setting that names no model to load; the message is one line that starts with the setting's key
    and names the path or hub id (`legalpt-eval` prints it alone and exits)."""


MODEL_FOLDER = "a Hugging Face model folder (a run's hf/ export, or the run folder that holds it)"


def newest_export(runs_dir: Path) -> Path:
    """The most recently written HF export among the run folders in `runs_dir`."""
    exports = [p.parent for p in runs_dir.expanduser().glob(f"*/{EXPORT_DIR}/config.json")]
    if not exports:
        raise CheckpointError(
            f"eval.runs_dir={str(runs_dir)!r}: no run with an HF export (*/{EXPORT_DIR}/config.json); "
            "train one with legalpt-train or pass eval.checkpoint=<folder or hub id>"
        )
    return max(exports, key=lambda p: (p / "config.json").stat().st_mtime)


def resolve_checkpoint(checkpoint: str | None, runs_dir: str, key: str = "eval.checkpoint") -> str:
    """A checkpoint setting as something `from_pretrained` loads: a run folder means its export; None the newest.

    Checked before anything loads: a local folder must hold config.json and a tokenizer; a name that is no folder
    must be a hub id whose config.json the hub (or, offline, the local cache) has. Raises CheckpointError."""
    if checkpoint is None:
        return str(newest_export(Path(runs_dir)))
    path = Path(checkpoint).expanduser()
    if (export_dir(path) / "config.json").is_file():
        path = export_dir(path)
    if path.is_dir():
        _check_model_folder(path, key)
        return str(path)
    if path.exists():
        raise CheckpointError(f"{key}: {checkpoint} is a file: expected {MODEL_FOLDER}, or a hub id")
    _check_hub_id(checkpoint, key)
    return checkpoint


def _check_model_folder(path: Path, key: str) -> None:
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{key}: {path} has no config.json: expected {MODEL_FOLDER}")
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise CheckpointError(
            f"{key}: {path} has no tokenizer (tokenizer.json or tokenizer_config.json): expected {MODEL_FOLDER}, "
            "saved with its tokenizer"
        )


def _check_hub_id(name: str, key: str) -> None:
    """That `name` is a hub id (owner/name) whose config.json can be had: from the hub, or offline from the cache."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import validate_repo_id

    expected = f"expected {MODEL_FOLDER}, or a hub id (owner/name)"
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise CheckpointError(f"{key}: {name} is not a folder and not a hub id: {expected}") from None
    try:
        hf_hub_download(name, "config.json")
    except LocalEntryNotFoundError:  # offline, or the hub unreachable, and nothing cached
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub could not be reached"
        raise CheckpointError(
            f"{key}: {name} is not a folder, and as a hub id it is not in the local cache ({why}): download it once "
            f"online, or pass {MODEL_FOLDER}"
        ) from None
    except RepositoryNotFoundError:  # also a gated or private repo without access
        raise CheckpointError(
            f"{key}: {name} is not a folder, and no model on the hub has that id (or it is private or gated: "
            f"log in with `hf auth login`): {expected}"
        ) from None
    except EntryNotFoundError:
        raise CheckpointError(f"{key}: hub repo {name} has no config.json: expected a Hugging Face model") from None


def default_output_dir(checkpoint: str) -> Path:
    """<checkpoint>/eval for a local folder; ./eval for a hub id."""
    folder = Path(checkpoint).expanduser()
    return folder / "eval" if folder.is_dir() else Path("eval")


def training_documents(checkpoints: list[str]) -> TrainingDocuments:
    """The documents any of `checkpoints` was trained on, from their runs' manifests; a checkpoint without one (a hub
    model, or a folder trained elsewhere) is named in a warning, since nothing can be left out for it."""
    found = {checkpoint: TrainingDocuments.find(checkpoint) for checkpoint in checkpoints}
    for checkpoint in (c for c, path in found.items() if path is None):
        log.warning("%s: no %s beside it or its run folder: its training documents cannot be left out", checkpoint,
                    MANIFEST)  # fmt: skip
    return TrainingDocuments.load(path for path in found.values() if path is not None)


def heldout_documents(
    cfg: DataConfig, max_documents: int, everything: bool = False, training: TrainingDocuments | None = None
) -> tuple[list[dict], dict]:
    """The documents to score, cleaned as training cleans them: the corpus's held-out split (split exactly as
    training split it), or with `everything` every document; at most `max_documents` (0 = all), none of `training`.
    Also what loading skipped and how many documents were left out as trained on.

    A streamed corpus, or a checkpoint trained on a stream, is read as a stream: its split is a hash rule on the
    text as read (legalpt/data/stream.py), which only a stream of raw records can apply."""
    training = training or TrainingDocuments()
    if cfg.streaming or training.needs_raw_text:
        rows, skipped, excluded = _streamed_documents(cfg, max_documents, everything, training)
    else:
        corpus = split_corpus(cfg)
        candidates, skipped = corpus.documents if everything else corpus.splits["heldout"], corpus.skipped
        rows = [{"id": r["id"], "text": r["text"], "kind": r["kind"]} for r in candidates]
        kept = [row for row in rows if not training.trained(row["text"])]
        excluded, rows = len(rows) - len(kept), kept[: max_documents or None]
    if not rows:
        raise ValueError(_nothing_to_score(cfg, everything, excluded, training))
    stats = {"documents": len(rows), "scope": "all" if everything else "heldout", "skipped": str(skipped)}
    return rows, {**stats, "excluded_training": excluded, "manifests": training.paths}


def _streamed_documents(
    cfg: DataConfig, limit: int, everything: bool, training: TrainingDocuments
) -> tuple[list[dict], SkipReport, int]:
    """`heldout_documents` of a corpus read as a stream of raw records, in stream order; reading stops at `limit`."""
    rows, skipped, excluded = [], SkipReport(), 0
    for record in stream_records(cfg):
        if reason := skip_reason(record):
            skipped.add(reason, record.get("id") or "")
            continue
        raw = record["text"]
        if not (everything or in_heldout(raw, cfg.heldout_fraction, cfg.seed)):
            continue
        if not (text := clean_text(raw, cfg.clean)):
            skipped.add("emptied by cleaning", record.get("id") or "")
        elif training.trained(text, raw):
            excluded += 1
        else:
            rows.append({"id": record["id"], "text": text, "kind": record["kind"]})
            if limit and len(rows) >= limit:
                break
    return rows, skipped, excluded


def _nothing_to_score(cfg: DataConfig, everything: bool, excluded: int, training: TrainingDocuments) -> str:
    if excluded:
        return (f"data: all {excluded} candidate documents were trained on (named in {', '.join(training.paths)}); "
                "evaluate on documents the checkpoint never saw")  # fmt: skip
    if everything:
        return f"data: no document to score in data.paths {list(cfg.paths)}"
    return "data: the held-out split is empty; use more documents, a larger data.heldout_fraction or eval.documents=all"


def build_eval_set(documents: list[dict], tokenizer, cfg: EvalConfig, tasks: list[str]) -> EvalSet:
    """Citation prompts and opinions to continue, from the held-out documents."""
    c = cfg.citations
    items, stats = citations.build_citation_items(documents, tokenizer, c.prompt_tokens, c.max_items, cfg.seed)
    sets = []
    if "citation_set" in tasks and c.set_documents > 0:
        sets = citations.set_items(
            documents, tokenizer, c.set_documents, c.set_prompt_tokens, c.set_new_tokens, cfg.seed
        )
    return EvalSet(items, sets, {"citations": stats, "citation_set_items": len(sets)})


def check_tasks(cfg: EvalConfig, data_format: str = "text") -> list[str]:
    """The tasks to run; choice only with data to run it on, harness only with harness tasks (whose names are
    checked here, before any model loads), response_loss only on fine-tuning examples (`data_format` sft) and the
    document tasks only on documents."""
    unknown = [t for t in cfg.tasks if t not in EVAL_TASKS]
    if unknown:
        raise ValueError(f"eval.tasks: unknown {unknown}, expected a subset of {list(EVAL_TASKS)}")
    tasks = [t for t in cfg.tasks if (t != "choice" or cfg.choice_data) and (t != "harness" or cfg.harness.tasks)]
    data_tasks = ("response_loss",) if data_format == "sft" else DOCUMENT_TASKS
    tasks = [t for t in tasks if t in data_tasks or t not in (*DOCUMENT_TASKS, "response_loss")]
    if "harness" in tasks:
        harness.check_tasks(cfg.harness)
    return tasks


def evaluate_checkpoint(
    checkpoint: str,
    cfg: Config,
    tasks: list[str],
    documents: list[dict],
    eval_set: EvalSet,
    accelerator,
    examples: datasets.Dataset | None = None,
) -> dict:
    """Every requested task for one checkpoint; generations are kept per item for the report. `examples` are the
    held-out fine-tuning examples of response_loss (`responses.heldout_examples`)."""
    e = cfg.eval
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = build_model(dataclasses.replace(cfg.model, pretrained=checkpoint), tokenizer).to(accelerator.device)
    model.eval()
    result: dict = {"checkpoint": checkpoint}
    with torch.no_grad(), accelerator.autocast():
        if "perplexity" in tasks:  # a context or stride of 0 is resolved (and checked) against the model there
            result["perplexity"] = document_perplexity(
                model, tokenizer, documents, e.perplexity_context, e.perplexity_stride, e.batch_size, e.bootstrap,
                e.seed,
            )  # fmt: skip
        if "response_loss" in tasks:
            result["response_loss"] = responses.response_loss(model, tokenizer, examples, cfg.data, e.batch_size)
        if "citations" in tasks:
            result["citations"] = score_citations(model, tokenizer, documents, eval_set, e)
        if "citation_set" in tasks and eval_set.set_items:
            result["citation_set"] = score_citation_sets(model, tokenizer, eval_set, e)
        if "choice" in tasks:
            items = choice.load_choice_items(e.choice_data, e.choice_format, e.choice_split)
            predictions = choice.score_choices(model, tokenizer, items, e.batch_size)
            result["choice"] = choice.summarize_choices(items, predictions, e.bootstrap, e.seed)
        if "harness" in tasks:
            result["harness"] = harness.run_harness(model, tokenizer, e.harness, e.batch_size, e.bootstrap)
    return result


def score_citations(model, tokenizer, documents: list[dict], eval_set: EvalSet, cfg: EvalConfig) -> dict:
    """Generate after every citation prompt, score each generation with eyecite, and summarize."""
    items = eval_set.citation_items
    index = citations.CitationIndex.from_documents(documents)
    generated = generate_with_stats(model, tokenizer, [item.prompt for item in items], cfg.generation, cfg.seed,
                                    desc="citations")  # fmt: skip
    texts = generated.texts
    scores = [citations.score_citation(item, text, index) for item, text in zip(items, texts, strict=True)]
    summary = citations.summarize_citations(items, scores, cfg.bootstrap, cfg.seed)
    summary["generation"] = {
        "prompts": len(items),
        "new_tokens": sum(generated.new_tokens),
        "seconds": generated.seconds,
        "prompts_per_s": len(items) / generated.seconds if generated.seconds else float("nan"),
        "truncated_prompts": sum(1 for t in generated.truncated if t),
    }
    summary["items"] = [
        {
            "id": item.id,
            "form": item.form,
            "generation": text,
            **score,
            "fabricated_reason": citations.fabrication_reason(score),
        }
        for item, text, score in zip(items, texts, scores, strict=True)
    ]
    return summary


def score_citation_sets(model, tokenizer, eval_set: EvalSet, cfg: EvalConfig) -> dict:
    """Continue each opinion and compare the cited cases with those of the real continuation."""
    items = eval_set.set_items
    generation_cfg = dataclasses.replace(cfg.generation, max_new_tokens=cfg.citations.set_new_tokens)
    texts = generate(model, tokenizer, [item.prompt for item in items], generation_cfg, cfg.seed, "citation sets")
    scores = [citations.score_citation_set(text, item.reference) for item, text in zip(items, texts, strict=True)]
    return citations.summarize_citation_set(items, scores, cfg.bootstrap, cfg.seed)


def _warn_if_cleaned_otherwise(training: TrainingDocuments, cfg: DataConfig) -> None:
    """Manifests hash cleaned text: documents cleaned by other settings would not be recognized."""
    if any(clean != dataclasses.asdict(cfg.clean) for clean in training.cleans):
        log.warning("data.clean differs from the cleaning the checkpoint's training used (%s): a training document "
                    "cleaned differently is not recognized; evaluate with the run's data.clean", MANIFEST)  # fmt: skip


def documents_and_eval_set(
    cfg: Config, tasks: list[str], checkpoints: list[str], out_dir: Path
) -> tuple[list[dict], EvalSet, dict]:
    """The documents to score and the eval set built from them (written to `out_dir`), with the report's sections on
    both; none of it, and no corpus read, when no task in `tasks` scores documents (choice and the harness read
    their own data)."""
    if not set(tasks) & set(DOCUMENT_TASKS):
        return [], EvalSet([], [], {}), {}
    training = training_documents(checkpoints)
    _warn_if_cleaned_otherwise(training, cfg.data)
    everything = cfg.eval.documents == "all"
    documents, data_stats = heldout_documents(cfg.data, cfg.eval.max_documents, everything, training)
    log.info(
        "documents: %d to score (%s), %d left out as training documents of the checkpoint(s)",
        data_stats["documents"],
        "every document" if everything else "held-out split",
        data_stats["excluded_training"],
    )
    if cfg.eval.eval_set:
        eval_set = EvalSet.load(Path(cfg.eval.eval_set).expanduser())
    else:
        eval_set = build_eval_set(documents, AutoTokenizer.from_pretrained(checkpoints[0]), cfg.eval, tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    eval_set.save(out_dir / "eval_set.jsonl")
    log.info(
        "eval set: %d citation prompts, %d opinions to continue → %s",
        len(eval_set.citation_items),
        len(eval_set.set_items),
        out_dir / "eval_set.jsonl",
    )
    eval_set_section = {"path": str(out_dir / "eval_set.jsonl"), **eval_set.stats}
    return documents, eval_set, {"data": data_stats, "eval_set": eval_set_section}


def evaluate(cfg: DictConfig | Config) -> dict:
    """Evaluate the checkpoint(s) `cfg` names, write the report, and return it."""
    cfg = to_config(cfg)
    tasks = check_tasks(cfg.eval, cfg.data.format)
    checkpoints = [resolve_checkpoint(cfg.eval.checkpoint, cfg.eval.runs_dir)]
    if cfg.eval.compare:
        checkpoints.append(resolve_checkpoint(cfg.eval.compare, cfg.eval.runs_dir, "eval.compare"))
    if "harness" in tasks:
        harness.check_data(cfg.eval.harness)
    out_dir = Path(cfg.eval.output_dir or default_output_dir(checkpoints[0])).expanduser()
    accelerator = Accelerator(mixed_precision=mixed_precision(cfg.train.mixed_precision))
    log_on_main_process_only(accelerator)

    documents, eval_set, sections = documents_and_eval_set(cfg, tasks, checkpoints, out_dir)
    examples = None
    if "response_loss" in tasks:  # the document tasks are off: the data section is the examples'
        everything, training = cfg.eval.documents == "all", training_documents(checkpoints)
        examples, sections["data"] = responses.heldout_examples(cfg.data, cfg.eval.max_documents, everything, training)
    results = {
        ckpt: evaluate_checkpoint(ckpt, cfg, tasks, documents, eval_set, accelerator, examples) for ckpt in checkpoints
    }
    report = {
        "checkpoints": results,
        **sections,
        "config": OmegaConf.to_container(OmegaConf.structured(cfg.eval), resolve=True),
    }
    if "harness" in tasks and len(results) == 2:
        report["forgetting"] = harness.forgetting(results)
    paths = write_report(report, out_dir, cfg.logger, cfg.project)
    log.info("report: %s", ", ".join(str(p) for p in paths))
    return report
