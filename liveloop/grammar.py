"""Constrained decoding's one grammar language, for every part that samples or re-scores tokens under
a constraint: an xgrammar structural tag (its JSON text, the `constraint` a request samples under and
the store keeps with the response), compiled against a model's tokenizer, walked token by token, and
the packed mask of the tokens allowed at each position (`allowed`: int32 words, bit j of word w
allows token 32 w + j, xgrammar's own layout).

    grammars = Grammars(tokenizer, vocab_size)
    walk = grammars.walk(constraint)            # the hf engine, per request
    walk.mask(logits_row)                       # -inf where the grammar forbids the token
    walk.accept(token)
    allowed = grammars.allowed(constraint, response_ids)   # the learner: the same masks, replayed
    mask_logits(logits, allowed)                # pure torch, differentiable through the allowed logits

vLLM compiles the same JSON text with its own xgrammar backend, built on the same tokenizer info
(`xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=...)`): a token's logprob it reports
under a constraint is the log-softmax of the masked logits (checked against a forward pass), which is
what `mask_logits` and a log-softmax give the learner. Knows nothing about tools, HTTP or models."""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

DISALLOWED = -1e9  # what `mask_logits` writes over a forbidden logit: exp() is 0 in float32, yet finite (no 0 * inf)
# the compiled-grammar cache's bound per process (xgrammar's default is none: one 1.1 KB schema of nested
# quantified patterns grew a process by ~360 MB); a grammar evicted is compiled again when next asked for
CACHE_LIMIT_BYTES = 64 << 20


class InvalidConstraint(ValueError):
    """A constraint xgrammar cannot compile (not a structural tag, or a JSON schema it refuses)."""


class ConstraintViolated(ValueError):
    """A token sequence the constraint does not allow (a stored response replayed under another grammar)."""


class GrammarDeadEnd(ValueError):
    """Generation reached a point where the constraint allows no token and has not ended (a `pattern`
    that matches nothing): that request ends, alone."""


class Grammars:
    """Compiles constraints for one tokenizer (compiled grammars are cached by their text). Thread-safe:
    xgrammar's compiler is; each `Walk` belongs to one request."""

    def __init__(self, tokenizer: Any, vocab_size: int, cache_limit_bytes: int = CACHE_LIMIT_BYTES):
        import xgrammar as xgr

        self._xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=True, cache_limit_bytes=cache_limit_bytes)
        self._lock = threading.Lock()

    def compile(self, constraint: str) -> Any:
        """The compiled grammar of `constraint` (raises InvalidConstraint)."""
        try:
            with self._lock:
                return self._compiler.compile_structural_tag(constraint)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError / its own types
            raise InvalidConstraint(f"the constraint does not compile: {str(exc)[:300]}") from exc

    def walk(self, constraint: str) -> Walk:
        return Walk(self._xgr, self.compile(constraint), self.info.vocab_size)

    def allowed(self, constraint: str, token_ids: Any) -> torch.Tensor:
        """The packed masks before each of `token_ids` under `constraint`, [n, words] int32 (raises
        ConstraintViolated at the first token it does not allow). A response cut short (max_tokens)
        replays its prefix."""
        walk = self.walk(constraint)
        out = torch.zeros((len(token_ids), walk.words), dtype=torch.int32)
        for i, token in enumerate(token_ids):
            out[i] = walk.fill()
            if not walk.accept(int(token)):
                raise ConstraintViolated(f"token {int(token)} at position {i} is not allowed by the constraint")
        return out


class Walk:
    """One sequence's way through a compiled grammar: the allowed tokens now, then the token taken."""

    def __init__(self, xgr: Any, compiled: Any, vocab_size: int):
        self._xgr = xgr
        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.words = self._bitmask.shape[1]

    def fill(self) -> torch.Tensor:
        """The packed mask of the tokens allowed next, [words] int32 (a view: copy it to keep it)."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        return self._bitmask[0]

    @property
    def dead_end(self) -> bool:
        """No token is allowed next and the grammar has not ended: the constraint cannot be satisfied from
        here (a `pattern` that matches nothing compiles; it shows only when the walk reaches it). Reads
        the mask the last `fill` or `mask` wrote."""
        return not bool(self._bitmask[0].any()) and not self.finished

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits (one row [V], float32, on the CPU) of the tokens not allowed next to -inf."""
        self.fill()
        self._xgr.apply_token_bitmask_inplace(logits[None], self._bitmask)

    def accept(self, token: int) -> bool:
        return bool(self._matcher.accept_token(token))

    @property
    def finished(self) -> bool:
        """The grammar has ended (its stop token was taken)."""
        return bool(self._matcher.is_terminated())


_SHARED: dict[tuple[str, int], Grammars] = {}
_SHARED_LOCK = threading.Lock()


def grammars_for(model_path: str, vocab_size: int, tokenizer: Any = None) -> Grammars:
    """This process's `Grammars` of the tokenizer in `model_path` (made once; `tokenizer`, if given,
    is that tokenizer already loaded): the serving edge compiles a request's constraint while checking
    it and the engine finds it compiled."""
    key = (str(model_path), int(vocab_size))
    with _SHARED_LOCK:
        if key not in _SHARED:
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(model_path))
            _SHARED[key] = Grammars(tokenizer, vocab_size)
        return _SHARED[key]


@functools.cache
def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(32, dtype=torch.int32, device=device)


def unpack(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed masks [..., words] int32 -> [..., vocab_size] bool (True: allowed)."""
    bits = (allowed[..., None] >> _bit_positions(allowed.device)) & 1
    return bits.reshape(*allowed.shape[:-1], -1)[..., :vocab_size].bool()


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` [n, V] with every logit the packed masks `allowed` [n, words] forbid set to DISALLOWED
    (out of place; gradients flow to the allowed logits only). A log-softmax of the result is the
    distribution restricted to the allowed tokens, renormalised."""
    keep = unpack(allowed.to(logits.device), logits.shape[-1])
    return logits.masked_fill(~keep, DISALLOWED)
