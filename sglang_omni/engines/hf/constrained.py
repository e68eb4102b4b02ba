"""JSON-schema constrained decoding for transformers' ``generate``, with llguidance.

``SchemaConstraint`` is a logits processor: before each token it masks every token the schema
forbids next, so whatever the weights (random ones included) the output is a prefix of a valid
document, and the end-of-sequence token is allowed only once the document is complete.

A token budget alone could still cut a document off mid-string. So once fewer than
``CLOSING_RESERVE`` tokens are left, the constraint prefers, among the allowed tokens, the ones
that close what is open (end of sequence, ``"}``, ``"``, ``}``, ``]``); the schema's fixed parts
(keys, constants) are forced by the grammar anyway, and the document completes inside the budget.
"""

from __future__ import annotations

import json
from typing import Any

from sglang_omni.errors import BadRequest

CLOSING_RESERVE = 48
CLOSERS = ('"}', '"', "}", "]")
MIN_BUDGET = CLOSING_RESERVE + 16


def schema_of(response_format: Any) -> dict[str, Any] | None:
    """The JSON schema a response_format asks for; None when it asks for plain text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise BadRequest("response_format: expected an object")
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        body = response_format.get("json_schema") or {}
        schema = body.get("schema") if isinstance(body, dict) else None
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema: expected a JSON schema object")
        return schema
    raise BadRequest(f"response_format.type: {kind!r} is not one of text, json_object, "
                     "json_schema")


class Vocabulary:
    """The llguidance view of a tokenizer, built once (about a second for a large vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: list[int]) -> None:
        import llguidance.hf

        self.size = vocab_size
        self.eos_ids = eos_ids
        self.ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                               eos_token=eos_ids[0])
        pieces = {tokenizer.convert_tokens_to_string([t]): i
                  for t, i in tokenizer.get_vocab().items() if i < vocab_size}
        self.closers = [pieces[c] for c in CLOSERS if c in pieces]

    def grammar(self, schema: dict[str, Any]) -> str:
        """A compact-JSON grammar (no free whitespace) in the schema's property order."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
        error = llguidance.LLMatcher.validate_grammar(grammar, self.ll)
        if error and not error.startswith("WARNING"):
            raise BadRequest(f"response_format: the JSON schema cannot be enforced: {error}")
        return grammar


class SchemaConstraint:
    """A transformers logits processor enforcing one grammar over one sequence (batch of 1)."""

    def __init__(self, vocab: Vocabulary, grammar: str, prompt_len: int,
                 max_new_tokens: int) -> None:
        import llguidance

        self.vocab = vocab
        self.matcher = llguidance.LLMatcher(vocab.ll, grammar)
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self.consumed = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import numpy as np
        import torch

        generated = input_ids.shape[1] - self.prompt_len
        # Only the tokens not consumed yet cross to the host (one per step, not the sequence).
        start = self.prompt_len + self.consumed
        self._consume_tail(input_ids[0, start:].tolist())
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(words, bitorder="little")[:self.vocab.size].astype(bool)
        if self.max_new_tokens - generated <= CLOSING_RESERVE:
            allowed = self._prefer_closing(allowed)
        mask = torch.from_numpy(~allowed).to(scores.device)
        width = min(scores.shape[-1], mask.shape[0])
        scores = scores.clone()
        scores[:, :width] = scores[:, :width].masked_fill(mask[:width], float("-inf"))
        scores[:, width:] = float("-inf")
        return scores

    def _prefer_closing(self, allowed: Any) -> Any:
        import numpy as np

        for token in [*self.vocab.eos_ids, *self.vocab.closers]:
            if token < allowed.shape[0] and allowed[token]:
                only = np.zeros_like(allowed)
                only[token] = True
                return only
        return allowed

    def _consume(self, ids: list[int]) -> None:
        self._consume_tail(ids[self.prompt_len + self.consumed:])

    def _consume_tail(self, tokens: list[int]) -> None:
        for token in tokens:
            self.consumed += 1
            if token in self.vocab.eos_ids:
                break
            self.matcher.consume_token(int(token))
        if self.matcher.is_error():
            raise RuntimeError(f"constrained decoding failed: {self.matcher.get_error()}")

    def complete(self, ids: list[int]) -> bool:
        """Whether the whole output ``ids`` (prompt included) is a complete document."""
        self._consume(ids)
        return self.matcher.is_accepting()
