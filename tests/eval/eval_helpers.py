"""Test helpers shared by the eval tests: a word-level tokenizer whose ids are easy to reason about, and
lm-evaluation-harness task YAMLs over local files."""

import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
VOCAB = 64


def make_tokenizer(bos: bool) -> PreTrainedTokenizerFast:
    """Words w0.. are tokens; anything else is <unk>. With `bos`, every text starts with <s>, as Llama's do."""
    words = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    if bos:
        tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def metrics(*names: str, **options) -> list[dict]:
    """A task's metric_list: each metric a mean over examples, higher being better, with `options`."""
    return [{"metric": name, "aggregation": "mean", "higher_is_better": True, **options} for name in names]


FIRST_ANSWER = [{"name": "get-answer", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}]


def local_task(name: str, files: dict, **fields) -> str:
    """An lm-eval task YAML named `name` over local JSON lines files (split -> path; scored on "test"), with
    `fields` (output_type, doc_to_text, metric_list, ...)."""
    data_files = {split: str(path) for split, path in files.items()}
    task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": data_files}, "test_split": "test",
            **fields, "metadata": {"version": 1.0}}  # fmt: skip
    return yaml.safe_dump(task, sort_keys=False)
