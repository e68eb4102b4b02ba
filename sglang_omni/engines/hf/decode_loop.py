"""``generate`` for one sequence over a ``StaticDecoder``: the same rules, a faster step.

``static_generate(decoder, inputs, **kwargs)`` takes the keyword arguments the hf Reasoner gives
``model.generate`` and returns what ``generate`` returns (the sequences, or with
``return_dict_in_generate`` an object with ``sequences`` and the raw ``logits`` of each step).
Each step follows transformers 5.23's sampling loop: raw logits in float32, then the logits
processors in transformers' order (repetition penalty, minimum new tokens, the caller's
processors such as the JSON-schema constraint, then with sampling the temperature, top-k, top-p
and min-p warpers, with the model's generation config filling unset fields as ``generate`` does),
then the arg max or a multinomial draw, then the streamer, then the stopping rules (length,
end-of-sequence tokens, stop strings, the caller's criteria). Greedy output equals
``generate``'s up to floating-point summation order (the tests compare them in float32).
"""

from __future__ import annotations

from typing import Any

from sglang_omni.engines.hf.static_decode import StaticDecoder

GENERATION_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p",
                     "repetition_penalty", "min_new_tokens", "max_new_tokens", "eos_token_id",
                     "pad_token_id")
HANDLED = {*GENERATION_FIELDS, "logits_processor", "stopping_criteria", "stop_strings",
           "tokenizer", "streamer", "return_dict_in_generate", "output_logits"}


class StaticOutput:
    """What ``generate(return_dict_in_generate=True, output_logits=True)`` returns, in part."""

    def __init__(self, sequences: Any, logits: tuple[Any, ...]) -> None:
        self.sequences = sequences
        self.logits = logits


def supports(kwargs: dict[str, Any]) -> bool:
    """Whether ``static_generate`` handles these ``generate`` arguments."""
    return set(kwargs) <= HANDLED


def static_generate(decoder: StaticDecoder, inputs: Any, prefilled: Any = None,
                    **kwargs: Any) -> Any:
    """``generate`` over ``decoder``; ``prefilled``: a ``DynamicCache`` holding all but the
    prompt's last token (``StaticDecoder.resume``) instead of a prefill of ``inputs``."""
    import torch
    from transformers import LogitsProcessorList

    if not supports(kwargs):
        raise TypeError(f"static decoding does not take {sorted(set(kwargs) - HANDLED)}")
    model = decoder.model
    config, _ = model._prepare_generation_config(
        None, **{k: kwargs[k] for k in GENERATION_FIELDS if k in kwargs})
    eos = config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    prompt = inputs["input_ids"]
    if prompt.shape[0] != 1:
        raise ValueError("static decoding takes one sequence")
    prompt_len = int(prompt.shape[1])
    max_new = int(config.max_new_tokens)
    processors = _processors(config, prompt_len, eos_ids, kwargs.get("logits_processor"),
                             decoder.device)
    criteria = list(kwargs.get("stopping_criteria") or [])
    if kwargs.get("stop_strings"):
        from transformers import StopStringCriteria

        criteria.append(StopStringCriteria(kwargs["tokenizer"], kwargs["stop_strings"]))
    streamer = kwargs.get("streamer")
    keep_logits = bool(kwargs.get("return_dict_in_generate") and kwargs.get("output_logits"))

    ids = torch.empty(1, prompt_len + max_new, dtype=torch.long, device=decoder.device)
    ids[:, :prompt_len] = prompt.to(decoder.device)
    if streamer is not None:
        streamer.put(prompt.cpu())
    raw_logits: list[Any] = []
    length = prompt_len
    with torch.inference_mode():
        if prefilled is None:
            logits = decoder.prefill(inputs, prompt_len + max_new)
        else:
            logits = decoder.resume(prefilled, ids[:, :prompt_len], prompt_len + max_new)
        while True:
            if keep_logits:
                raw_logits.append(logits.clone())
            sequence = ids[:, :length]
            scores = LogitsProcessorList(processors)(sequence, logits)
            if config.do_sample:
                probs = torch.nn.functional.softmax(scores, dim=-1)
                token = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                token = torch.argmax(scores, dim=-1)
            ids[:, length] = token
            length += 1
            if streamer is not None:
                streamer.put(token.cpu())
            value = int(token.item())
            if (length - prompt_len >= max_new or value in eos_ids
                    or _stopped(criteria, ids[:, :length], scores)):
                break
            logits = decoder.step(token, length - 1)
    if streamer is not None:
        streamer.end()
    sequences = ids[:, :length].clone()
    if kwargs.get("return_dict_in_generate"):
        return StaticOutput(sequences, tuple(raw_logits))
    return sequences


def _processors(config: Any, prompt_len: int, eos_ids: list[int], custom: Any,
                device: Any) -> list[Any]:
    """transformers' processor order for the fields the hf Reasoner sets."""
    from transformers import (
        MinNewTokensLengthLogitsProcessor,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list[Any] = []
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        out.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.min_new_tokens is not None and config.min_new_tokens > 0 and eos_ids:
        out.append(MinNewTokensLengthLogitsProcessor(prompt_len, config.min_new_tokens, eos_ids,
                                                     device=device))
    out.extend(custom or [])
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            out.append(TemperatureLogitsWarper(config.temperature))
        if config.top_k is not None and config.top_k != 0:
            out.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
        if config.min_p is not None:
            out.append(MinPLogitsWarper(min_p=config.min_p, min_tokens_to_keep=1))
    return out


def _stopped(criteria: list[Any], sequence: Any, scores: Any) -> bool:
    return any(bool(criterion(sequence, scores).any()) for criterion in criteria)
