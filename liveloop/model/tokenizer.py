"""Byte-level BPE tokenizer and chat template for the embedded default model.

Owns the special tokens and the chat format:
    <|user|>\\n{prompt}<|end|>\\n<|assistant|>\\n{reply}<|end|>\\n
"<|end|>" closes every turn and is the eos token; "<|endoftext|>" pads. Knows nothing about models.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|end|>"
ROLE_TOKENS = ("<|user|>", "<|assistant|>", "<|system|>")
SPECIAL_TOKENS = (PAD_TOKEN, *ROLE_TOKENS, EOS_TOKEN)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` tokens (specials included) on `texts`."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} is below the byte alphabet plus specials "
                         f"({len(alphabet) + len(SPECIAL_TOKENS)})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
