"""Byte-level BPE tokenizer and chat template for the embedded default model.

Owns the special tokens and the chat format:
    <|user|>\\n{prompt}<|end|>\\n<|assistant|>\\n{reply}<|end|>\\n
"<|end|>" closes every turn and is the eos token; "<|endoftext|>" pads. Knows nothing about models.

Tools use the Hermes / Qwen format, so the server's `hermes` tool-call parser reads this model too:
the offered functions go in the system turn, one JSON object a line inside <tools>...</tools>; an
assistant turn calls them as `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>` (after
its text, if any, and a newline; several calls one a line), its arguments written exactly as given
when they are a string (what the model sampled, as a client sends it back), else as JSON; the results
of a turn's calls come back as one user turn of `<tool_response>\\n...\\n</tool_response>` blocks. A
conversation without tools renders exactly as before (the default build's corpus has none: the model
learns tool use from its own rated trajectories; `ModelBuildConfig.tool_fraction` opts into tool
dialogues, liveloop/model/tool_corpus.py).
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
    "{%- if tools %}"
    "{{- '<|system|>\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '<tools>\n' }}"
    "{%- for tool in tools %}{{- (tool.function if tool.function is defined else tool) | tojson }}{{- '\n' }}{%- endfor %}"
    "{{- '</tools><|end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|user|>\n' }}{%- else %}{{- '\n' }}{%- endif %}"
    "{{- '<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|end|>\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}"
    "{{- '<|assistant|>\n' + (message['content'] or '') }}"
    "{%- for call in message.tool_calls %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{%- if message['content'] or not loop.first %}{{- '\n' }}{%- endif %}"
    "{{- '<tool_call>\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}"
    "{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|end|>\n' }}"
    "{%- else %}"
    "{{- '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\n' }}{%- endif %}"
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
