"""Request and response encoding for the served models, over tritonclient's HTTP and gRPC modules and
over the HTTP generate extension (JSON and server-sent events). Tensor names and dtypes come from the
models' config.pbtxt through `model_spec`; nothing here repeats them."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .model_spec import MODEL_REPOSITORY, ModelSpec

EMBED_MODEL = "embed"  # text in, embedding out (tokenizer inside the server)
TOKEN_MODEL = "minilm"  # token ids in, embedding out
GENERATE_MODEL = "gpt2"
FINAL_RESPONSE_PARAMETER = "triton_final_response"  # set by Triton on a decoupled model's last response

# The decoding models' tensor names: the convention of Triton's LLM backends, which gpt2 and
# gpt2_static declare in config.pbtxt (tests/unit/test_client_payloads.py checks the two agree).
TEXT_INPUT, INPUT_IDS, STREAM = "text_input", "input_ids", "stream"
LIST_INPUTS = (INPUT_IDS, "stop_token_ids")  # the inputs that carry a list, not one value
TEXT_OUTPUT, OUTPUT_IDS, FINISH_REASON = "text_output", "output_ids", "finish_reason"
COUNT_OUTPUTS = ("num_input_tokens", "num_output_tokens")
# The encoder's inputs, by the field of a `tokenizers` Encoding that fills each (as `embed` does).
ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


def tensors(module, spec: ModelSpec, values: dict[str, object]) -> list:
    """InferInputs (of tritonclient.http or .grpc, whichever `module` is) for `values`, each converted
    to the dtype the model declares for that input."""
    inputs = []
    for name, value in values.items():
        tensor_spec = spec.input(name)
        array = value if isinstance(value, np.ndarray) else np.array(value, dtype=tensor_spec.numpy_dtype)
        if tensor_spec.wire_dtype == "BYTES":
            array = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array)
        elif array.dtype != tensor_spec.numpy_dtype:
            array = array.astype(tensor_spec.numpy_dtype)
        tensor = module.InferInput(name, list(array.shape), tensor_spec.wire_dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def embedding_output(spec: ModelSpec) -> str:
    (output,) = spec.outputs
    return output.name


def text_values(spec: ModelSpec, texts: list[str]) -> dict[str, np.ndarray]:
    """The `embed` model's one text input, shaped [batch, 1]."""
    (text_input,) = spec.inputs
    return {text_input.name: np.array([[t.encode()] for t in texts], dtype=object)}


@lru_cache(maxsize=None)
def load_tokenizer(path: Path = MODEL_REPOSITORY / TOKEN_MODEL / "1" / "tokenizer.json"):
    """The tokenizer that `embed` runs server-side, for clients that send token ids to `minilm`."""
    from tokenizers import Tokenizer

    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} is missing: `make export` writes it next to the ONNX model")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()  # padded to the request's longest text below, not to the file's fixed length
    return tokenizer


def token_values(spec: ModelSpec, texts: list[str], max_length: int = 256) -> dict[str, np.ndarray]:
    """`minilm`'s inputs for `texts`: token ids, mask and type ids, padded to the longest text."""
    unknown = [n for n in spec.input_names if n not in ENCODING_FIELDS]
    if unknown:
        raise ValueError(f"{spec.name} has inputs {unknown} that a tokenizer does not produce")
    tokenizer = load_tokenizer()
    tokenizer.enable_truncation(max_length)  # keeps [CLS] and [SEP] around the cut, as `embed` does
    encodings = tokenizer.encode_batch(texts)
    length = max(len(e.ids) for e in encodings)
    values = {}
    for name in spec.input_names:
        rows = np.zeros((len(encodings), length), dtype=spec.input(name).numpy_dtype)  # 0 pads every field
        for row, e in zip(rows, encodings):
            field = getattr(e, ENCODING_FIELDS[name])
            row[:len(field)] = field
        values[name] = rows
    return values


def embedding_values(spec: ModelSpec, texts: list[str], max_length: int = 256) -> dict[str, np.ndarray]:
    """The inputs of an embedding model for `texts`: the text itself for a model with one string
    input (`embed`), token ids made here for one that takes a tokenizer's fields (`minilm`)."""
    (first, *rest) = spec.inputs
    if not rest and first.wire_dtype == "BYTES":
        return text_values(spec, texts)
    return token_values(spec, texts, max_length)


@dataclass(frozen=True)
class Sampling:
    """Sampling inputs of a generation request; None leaves the server's default. Field names are the
    model's input names (checked against its config by `generate_values`)."""

    max_tokens: int | None = 16
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    random_seed: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: tuple[int, ...] | None = None


def generate_values(spec: ModelSpec, prompt: str | list[int], sampling: Sampling, stream: bool) -> dict:
    """Input name -> value for one generation request: `text_input` for a string prompt, `input_ids`
    for token ids; the sampling fields that are set; `stream`."""
    values: dict[str, object] = {}
    if isinstance(prompt, str):
        values[TEXT_INPUT] = [prompt]
    else:
        values[INPUT_IDS] = [int(t) for t in prompt]
    for name, value in asdict(sampling).items():
        if value is not None:
            values[name] = list(value) if isinstance(value, (tuple, list)) else [value]
    values[STREAM] = [stream]
    for name in values:
        spec.input(name)  # KeyError naming the model's inputs if the config lacks one
    return values


def generate_body(spec: ModelSpec, prompt: str | list[int], sampling: Sampling, stream: bool) -> dict:
    """The JSON body of `/v2/models/<m>/generate[_stream]`: scalars for one-element inputs."""
    values = generate_values(spec, prompt, sampling, stream)
    return {name: (value if name in LIST_INPUTS else value[0]) for name, value in values.items()}


@dataclass(frozen=True)
class Chunk:
    """One response of a generation request: the tokens it carries and, on the last, why it ended."""

    token_ids: tuple[int, ...]
    text: str
    is_final: bool
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None


def chunk_from_result(result) -> Chunk:
    """A tritonclient (gRPC) InferResult of `gpt2` as a Chunk."""
    response = result.get_response()
    is_final = response.parameters[FINAL_RESPONSE_PARAMETER].bool_param
    names = {o.name for o in response.outputs}

    def scalar(name):
        return result.as_numpy(name).reshape(-1)[0] if name in names else None

    text = scalar(TEXT_OUTPUT)
    reason = scalar(FINISH_REASON)
    ids = result.as_numpy(OUTPUT_IDS) if OUTPUT_IDS in names else np.zeros(0, dtype=np.int32)
    counts = {k: scalar(k) for k in COUNT_OUTPUTS}
    return Chunk(
        token_ids=tuple(int(t) for t in ids.reshape(-1)),
        text=text.decode() if text is not None else "",
        is_final=is_final,
        finish_reason=reason.decode() if reason is not None and is_final else None,
        **{k: int(v) if v is not None else None for k, v in counts.items()},
    )


def chunk_from_event(event: dict, is_final: bool | None = None) -> Chunk:
    """One JSON object of the HTTP generate extension (a whole `/generate` answer or one SSE event).
    The final event carries the finish reason; the others carry it empty."""
    reason = event.get(FINISH_REASON) or None
    ids = event.get(OUTPUT_IDS, [])
    return Chunk(
        token_ids=tuple(int(t) for t in (ids if isinstance(ids, list) else [ids])),
        text=event.get(TEXT_OUTPUT, "") or "",
        is_final=bool(reason) if is_final is None else is_final,
        finish_reason=reason,
        **{k: event.get(k) for k in COUNT_OUTPUTS},
    )


def parse_sse(lines: Iterable[bytes | str]) -> Iterator[dict]:
    """The JSON `data:` events of a server-sent-event stream, one per event. Triton reports an error
    inside a stream as an event with an `error` field; the caller decides what it means."""
    data: list[str] = []
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
    if data:
        yield json.loads("\n".join(data))
