"""Tokenization and length bucketing for the `embed` model: texts in, groups of equal-length token
rows out, each group ready to go to the encoder as one request. No Triton imports."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Hugging Face's names for the encoder inputs and the tokenizer field that fills each.
ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


class RequestError(ValueError):
    """A text the model cannot take; only its request fails."""


class ConfigError(ValueError):
    """A bad `parameters` value in config.pbtxt; the message names the key."""


@dataclass(frozen=True)
class EmbedConfig:
    encoder_model: str
    max_length: int
    truncate: bool
    length_buckets: tuple[int, ...]  # ascending; empty: pad each group to its own longest

    def __post_init__(self):
        if not self.encoder_model:
            raise ConfigError("parameters['encoder_model'] must name the encoder model")
        if self.max_length < 2:
            raise ConfigError(f"parameters['max_length'] must be >= 2 (room for [CLS] and [SEP]), got {self.max_length}")
        if list(self.length_buckets) != sorted(set(self.length_buckets)) or any(b < 1 for b in self.length_buckets):
            raise ConfigError(f"parameters['length_buckets'] must be ascending positive integers, got {self.length_buckets}")
        if self.length_buckets and self.length_buckets[-1] < self.max_length:
            raise ConfigError(
                f"parameters['length_buckets'] must reach max_length {self.max_length}; the largest is {self.length_buckets[-1]}"
            )


def parse_embed_config(parameters: dict) -> EmbedConfig:
    """Build the config from the `parameters` map of the JSON model config."""
    def get(key: str, default: str) -> str:
        return (parameters.get(key) or {}).get("string_value", default).strip()

    try:
        max_length = int(get("max_length", "256"))
    except ValueError:
        raise ConfigError(f"parameters['max_length'] must be an integer, got {get('max_length', '')!r}") from None
    truncate = get("truncate", "false").lower()
    if truncate not in ("true", "false"):
        raise ConfigError(f"parameters['truncate'] must be \"true\" or \"false\", got {truncate!r}")
    raw_buckets = get("length_buckets", "")
    try:
        buckets = tuple(int(b) for b in raw_buckets.split(",") if b.strip())
    except ValueError:
        raise ConfigError(f"parameters['length_buckets'] must be comma-separated integers, got {raw_buckets!r}") from None
    return EmbedConfig(get("encoder_model", ""), max_length, truncate == "true", buckets)


def decode_texts(raw: np.ndarray) -> list[str]:
    """[batch, 1] bytes from Triton to str, refusing bytes that are not UTF-8."""
    texts = []
    for row, value in enumerate(raw.reshape(-1)):
        data = value if isinstance(value, bytes) else str(value).encode()
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise RequestError(f"text at row {row} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    return texts


def tokenize(tokenizer, texts: list[str], config: EmbedConfig) -> list:
    """Encodings without padding; an over-long text fails its request unless truncation is on. The
    tokenizer truncates (model.py enables it), so the closing [SEP] survives the cut."""
    encodings = tokenizer.encode_batch(texts)
    for row, enc in enumerate(encodings):
        if len(enc.ids) > config.max_length:
            raise RequestError(
                f"text at row {row} is {len(enc.ids)} tokens long, above max_length {config.max_length}"
            )
    return encodings


def bucket_length(length: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if length <= b:
            return b
    return length


@dataclass(frozen=True)
class TokenGroup:
    rows: list[int]  # positions in the flat list of all rows of the batch
    arrays: dict[str, np.ndarray]  # encoder input name -> [len(rows), padded_length] int64


def group_rows(encodings: list, config: EmbedConfig, input_names: tuple[str, ...], max_batch: int) -> list[TokenGroup]:
    """Rows of one padded length go together, at most `max_batch` per group."""
    by_length: dict[int, list[int]] = {}
    for row, enc in enumerate(encodings):
        by_length.setdefault(bucket_length(len(enc.ids), config.length_buckets), []).append(row)
    if not config.length_buckets:  # no buckets: one group padded to its longest
        by_length = {max(by_length): [r for rows in by_length.values() for r in rows]} if by_length else {}
    groups = []
    for length, rows in sorted(by_length.items()):
        for start in range(0, len(rows), max_batch):
            chunk = rows[start : start + max_batch]
            groups.append(TokenGroup(chunk, _pad_rows([encodings[r] for r in chunk], length, input_names)))
    return groups


def _pad_rows(encodings: list, length: int, input_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    arrays = {}
    for name in input_names:
        field = ENCODING_FIELDS[name]
        out = np.zeros((len(encodings), length), dtype=np.int64)
        for i, enc in enumerate(encodings):
            values = getattr(enc, field)
            out[i, : len(values)] = values
        arrays[name] = out
    return arrays
