"""Test helpers shared by the eval tests: a word-level tokenizer whose ids are easy to reason about."""

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
