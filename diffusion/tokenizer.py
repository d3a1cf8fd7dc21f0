"""Character-level tokenizer of the tiny diffusion default, built locally (no training, no download).

Owns the alphabet of the two tasks (Sudoku digits, Countdown arithmetic, a few lowercase words) and the
special tokens a masked diffusion LM needs: "[PAD]", "[EOS]" (closes a response; leftover positions of a
fixed-length response are EOS as well), "[MASK]" (the diffusion noise token), "[UNK]". "<answer>" and
"</answer>" are single (non-special) tokens so a tiny model can learn the answer format cheaply.
Knows nothing about models.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, EOS_TOKEN, MASK_TOKEN, UNK_TOKEN = "[PAD]", "[EOS]", "[MASK]", "[UNK]"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, MASK_TOKEN, UNK_TOKEN)
TAG_TOKENS = ("<answer>", "</answer>")
ALPHABET = string.digits + string.ascii_lowercase + " +-*/().=|:,?<>\n"

# A user turn is its content followed by a newline; the response follows directly.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] + '\n' }}{% endfor %}"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The fixed character vocabulary: specials first (ids 0..3), then the answer tags, then characters."""
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *TAG_TOKENS, *ALPHABET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        mask_token=MASK_TOKEN,
        unk_token=UNK_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    wrapped.add_tokens(list(TAG_TOKENS))  # matched before the character split
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped
