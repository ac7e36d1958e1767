"""Triton edge of the continuous-decoding backend (`backend: "continuous_decoding"`, decoupled).

execute() parses each request and hands it to the engine loop's thread, then returns; that thread
streams one response per generated token (or one at the end) and always ends a request with one
final response that carries the finish reason and token counts. Scheduling lives in engine/."""
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from detokenizer import IncrementalDetokenizer
from engine.config import EngineConfig
from engine.engine import LLMEngine, TokenOutput
from engine.engine_loop import EngineLoop, Submission
from engine.sampling_params import InvalidRequest
from engine.weights import load_weights
from request_inputs import (FINISH_REASON, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS, OUTPUT_IDS, OUTPUT_NAMES,
                            TEXT_OUTPUT, parse_request)
from stream_metrics import EngineMetrics

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError(f"{config['name']}: set `model_transaction_policy {{ decoupled: true }}`; "
                             "tokens are streamed as separate responses")
        params = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
        self.engine_config = EngineConfig.from_parameters(params)
        model_dir = Path(args["model_repository"]) / args["model_version"]
        weights = load_weights(model_dir)
        self.tokenizer = _load_tokenizer(model_dir / "tokenizer.json")
        engine = LLMEngine(self.engine_config, weights)
        self.metrics = EngineMetrics(pb_utils, config["name"], engine.block_manager.num_blocks)
        self.loop = EngineLoop(engine, on_step=self.metrics.update).start()
        pb_utils.Logger.log_info(
            f"{config['name']}: {self.engine_config.scheduling} batching, {engine.block_manager.num_blocks} KV "
            f"blocks of {self.engine_config.block_size} tokens, max_num_seqs {self.engine_config.max_num_seqs}"
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                arrays = {t.name(): t.as_numpy() for t in request.inputs()}
                parsed = parse_request(arrays, self.tokenizer, self.engine_config.max_model_len)
                outputs = _requested_outputs(request)
            except InvalidRequest as e:
                _send_error(sender, str(e), pb_utils.TritonError.INVALID_ARG)
                continue
            except Exception as e:  # a bug, not the client's fault: this request alone fails
                _send_error(sender, f"could not parse the request: {e}", pb_utils.TritonError.INTERNAL)
                continue
            sink = ResponseSink(sender, parsed.stream, self.tokenizer, outputs)
            self.loop.submit(Submission(parsed.prompt_token_ids, parsed.sampling, sink, _priority(request)))
        return None

    def finalize(self):
        self.loop.stop()


class ResponseSink:
    """One request's response sender; used by the engine thread only. Builds only the outputs the
    client asked for: a client of token ids costs no detokenizing."""

    def __init__(self, sender, stream: bool, tokenizer, outputs: frozenset[str]):
        self.sender = sender
        self.stream = stream
        self.outputs = outputs
        self.tokenizer = tokenizer if TEXT_OUTPUT in outputs else None
        self.detokenizer = IncrementalDetokenizer(tokenizer) if self.tokenizer is not None else None
        self.token_ids: list[int] = []

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()

    def on_token(self, out: TokenOutput) -> None:
        if out.token_id is not None:
            self.token_ids.append(out.token_id)
        if self.stream:
            new_ids = [out.token_id] if out.token_id is not None else []
            text = self.detokenizer.add(out.token_id, final=out.finished) if self.detokenizer else ""
            arrays = self._tokens(new_ids, text)
        elif out.finished:
            text = self.tokenizer.decode(self.token_ids) if self.tokenizer is not None else ""
            arrays = self._tokens(self.token_ids, text)
        else:
            return
        if out.finished:
            arrays[FINISH_REASON] = np.array([out.finish_reason.value.encode()], dtype=np.object_)
            arrays[NUM_INPUT_TOKENS] = np.array([out.num_prompt_tokens], dtype=np.int32)
            arrays[NUM_OUTPUT_TOKENS] = np.array([out.num_output_tokens], dtype=np.int32)
        tensors = [pb_utils.Tensor(name, array) for name, array in arrays.items() if name in self.outputs]
        self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if out.finished else 0)

    def on_error(self, message: str, invalid_argument: bool) -> None:
        code = pb_utils.TritonError.INVALID_ARG if invalid_argument else pb_utils.TritonError.INTERNAL
        _send_error(self.sender, message, code)

    @staticmethod
    def _tokens(ids: list[int], text: str) -> dict[str, np.ndarray]:
        return {OUTPUT_IDS: np.array(ids, dtype=np.int32), TEXT_OUTPUT: np.array([text.encode()], dtype=np.object_)}


def _requested_outputs(request) -> frozenset[str]:
    # Triton fills in every output when a client names none; an empty list is taken the same way.
    names = frozenset(request.requested_output_names())
    return names or frozenset(OUTPUT_NAMES)


def _send_error(sender, message: str, code) -> None:
    # A gRPC stream delivers an error's message without its code, so the message names the kind.
    if code == pb_utils.TritonError.INVALID_ARG:
        message = f"invalid argument: {message}"
    sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code)),
                flags=FINAL)


# Triton's priority 0 means "the model's default level", and 1 is the most urgent; the engine runs
# lower numbers first, so a request that set none goes behind every level a client asked for.
DEFAULT_PRIORITY = 1 << 30


def _priority(request) -> int:
    priority = getattr(request, "priority", None)  # older stubs do not expose it
    value = int(priority()) if callable(priority) else 0
    return value if value > 0 else DEFAULT_PRIORITY


def _load_tokenizer(path: Path):
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
