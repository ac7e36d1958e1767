"""Turns one generation request's input tensors into a prompt and sampling settings, refusing bad
values with InvalidRequest naming the input. The names follow Triton's LLM backends so that tools
written for them drive this model unchanged; config.pbtxt declares the same names (a unit test
checks that the two agree). No Triton imports."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.sampling_params import InvalidRequest, SamplingParams

TEXT_INPUT = "text_input"
INPUT_IDS = "input_ids"
MAX_TOKENS = "max_tokens"
STREAM = "stream"
TEMPERATURE = "temperature"
TOP_K = "top_k"
TOP_P = "top_p"
RANDOM_SEED = "random_seed"
IGNORE_EOS = "ignore_eos"
STOP_TOKEN_IDS = "stop_token_ids"
INPUT_NAMES = (TEXT_INPUT, INPUT_IDS, MAX_TOKENS, STREAM, TEMPERATURE, TOP_K, TOP_P, RANDOM_SEED,
               IGNORE_EOS, STOP_TOKEN_IDS)

TEXT_OUTPUT = "text_output"
OUTPUT_IDS = "output_ids"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
OUTPUT_NAMES = (TEXT_OUTPUT, OUTPUT_IDS, FINISH_REASON, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS)

DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class GenerationRequest:
    prompt_token_ids: list[int]
    sampling: SamplingParams
    stream: bool


def _scalar(arrays: dict[str, np.ndarray], name: str, kind: type, default):
    array = arrays.get(name)
    if array is None:
        return default
    if array.size != 1:
        raise InvalidRequest(name, f"must hold one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    if kind is bool:
        return bool(value)
    if kind is int:
        if not np.issubdtype(array.dtype, np.integer):
            raise InvalidRequest(name, f"must be an integer, got dtype {array.dtype}")
        return int(value)
    value = float(value)
    if not np.isfinite(value):
        raise InvalidRequest(name, f"must be finite, got {value}")
    return value


def _prompt(arrays: dict[str, np.ndarray], tokenizer) -> list[int]:
    has_text, has_ids = TEXT_INPUT in arrays, INPUT_IDS in arrays
    if has_text == has_ids:
        raise InvalidRequest("prompt", f"give exactly one of {TEXT_INPUT!r} (text) or {INPUT_IDS!r} (token ids)")
    if has_ids:
        ids = arrays[INPUT_IDS]
        if not np.issubdtype(ids.dtype, np.integer):
            raise InvalidRequest(INPUT_IDS, f"must be integers, got dtype {ids.dtype}")
        return [int(t) for t in ids.reshape(-1)]
    if tokenizer is None:
        raise InvalidRequest(TEXT_INPUT, "this model has no tokenizer.json; send token ids in 'input_ids'")
    raw = arrays[TEXT_INPUT].reshape(-1)
    if raw.size != 1:
        raise InvalidRequest(TEXT_INPUT, f"must hold one string, got {raw.size}")
    data = raw[0] if isinstance(raw[0], bytes) else str(raw[0]).encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(TEXT_INPUT, f"is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise InvalidRequest(TEXT_INPUT, "is empty")
    return tokenizer.encode(text, add_special_tokens=False).ids


def parse_request(arrays: dict[str, np.ndarray], tokenizer, max_model_len: int) -> GenerationRequest:
    unknown = sorted(set(arrays) - set(INPUT_NAMES))
    if unknown:
        raise InvalidRequest(unknown[0], f"unknown input; this model takes {', '.join(INPUT_NAMES)}")
    prompt = _prompt(arrays, tokenizer)
    if not prompt:
        raise InvalidRequest("prompt", "is empty")
    max_tokens = _scalar(arrays, MAX_TOKENS, int, DEFAULT_MAX_TOKENS)
    if not 1 <= max_tokens <= max_model_len:
        raise InvalidRequest(MAX_TOKENS, f"must be in [1, {max_model_len}], got {max_tokens}")
    top_k = _scalar(arrays, TOP_K, int, 0)
    stop = arrays.get(STOP_TOKEN_IDS)
    if stop is not None and not np.issubdtype(stop.dtype, np.integer):
        raise InvalidRequest(STOP_TOKEN_IDS, f"must be integers, got dtype {stop.dtype}")
    seed = _scalar(arrays, RANDOM_SEED, int, None)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=_scalar(arrays, TEMPERATURE, float, 0.0),
        top_k=top_k,
        top_p=_scalar(arrays, TOP_P, float, 1.0),
        seed=seed,
        stop_token_ids=tuple(int(t) for t in stop.reshape(-1)) if stop is not None else (),
        ignore_eos=_scalar(arrays, IGNORE_EOS, bool, False),
    )
    return GenerationRequest(prompt, sampling, _scalar(arrays, STREAM, bool, False))
