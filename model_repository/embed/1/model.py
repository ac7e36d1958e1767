"""Triton edge of `embed`: text in, sentence embedding out, by BLS calls to the encoder model.

Every text of the batch is tokenized at once, rows are grouped by padded length, and each group goes
to the encoder as one request; the encoder's dynamic batcher merges groups from all callers.
"""
import asyncio
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from google.protobuf import text_format
from tokenizers import Tokenizer
from tritonclient.grpc import model_config_pb2

from text_batching import ENCODING_FIELDS, ConfigError, RequestError, decode_texts, group_rows, parse_embed_config, tokenize


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        self.config = parse_embed_config(model_config.get("parameters") or {})
        self.input_name = model_config["input"][0]["name"]
        self.output_name = model_config["output"][0]["name"]
        encoder_dir = Path(args["model_repository"]).parent / self.config.encoder_model
        encoder = _read_config(encoder_dir / "config.pbtxt")
        self.encoder_inputs = tuple(t.name for t in encoder.input)
        unknown = [n for n in self.encoder_inputs if n not in ENCODING_FIELDS]
        if unknown:
            raise ConfigError(f"encoder {encoder.name!r} has inputs {unknown} that a tokenizer does not produce")
        self.encoder_output = encoder.output[0].name
        self.embedding_dim = encoder.output[0].dims[-1]
        self.encoder_max_batch = encoder.max_batch_size
        tokenizer_path = encoder_dir / "1" / "tokenizer.json"
        if not tokenizer_path.is_file():
            raise ConfigError(f"{tokenizer_path} is missing: run `make export`")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # Padding is this model's job (length buckets); truncation is the tokenizer's, which keeps
        # [CLS] and [SEP] around the cut. Without truncation an over-long text is refused.
        self.tokenizer.no_padding()
        if self.config.truncate:
            self.tokenizer.enable_truncation(self.config.max_length)
        else:
            self.tokenizer.no_truncation()

    async def execute(self, requests):
        responses = [None] * len(requests)
        encodings, owners = [], []  # owners[row] = index of the request the row belongs to
        for i, request in enumerate(requests):
            try:
                texts = decode_texts(pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy())
                rows = tokenize(self.tokenizer, texts, self.config)
            except RequestError as e:
                responses[i] = _error(str(e), pb_utils.TritonError.INVALID_ARG)
                continue
            encodings.extend(rows)
            owners.extend([i] * len(rows))
        groups = group_rows(encodings, self.config, self.encoder_inputs, self.encoder_max_batch)
        results = await asyncio.gather(*(self._encode(g.arrays) for g in groups))
        embeddings = np.zeros((len(encodings), self.embedding_dim), dtype=np.float32)
        failed = {}
        for group, (values, error) in zip(groups, results):
            if error is not None:
                failed.update({owners[r]: error for r in group.rows})
            else:
                embeddings[group.rows] = values
        owners = np.asarray(owners)
        for i in range(len(requests)):
            if responses[i] is not None:
                continue
            if i in failed:
                responses[i] = pb_utils.InferenceResponse(output_tensors=[], error=failed[i])
            else:
                rows = embeddings[owners == i]
                responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, rows)])
        return responses

    async def _encode(self, arrays):
        request = pb_utils.InferenceRequest(
            model_name=self.config.encoder_model,
            inputs=[pb_utils.Tensor(name, arrays[name]) for name in self.encoder_inputs],
            requested_output_names=[self.encoder_output],
        )
        response = await request.async_exec()
        if response.has_error():
            return None, response.error()
        return pb_utils.get_output_tensor_by_name(response, self.encoder_output).as_numpy(), None


def _read_config(path):
    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


def _error(message, code):
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
