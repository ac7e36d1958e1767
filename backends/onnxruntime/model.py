"""Triton edge of the Python-based ONNX Runtime backend (`backend: "onnxruntime"`).

Triton's dynamic batcher forms the batch; this runs it as one ONNX Runtime call and answers each
request with its own rows. Parsing, batching and the session live in the sibling modules.
"""
import numpy as np
import triton_python_backend_utils as pb_utils

from batching import RequestError, RequestInputs, merge, split, validate_request
from ort_config import parse_model_config
from ort_session import create_session


class TritonPythonModel:
    def initialize(self, args):
        self.config = parse_model_config(args["model_config"])
        path = self.config.model_path(args["model_repository"], args["model_version"])
        self.session = create_session(
            self.config, path, args.get("model_instance_kind", "CPU"), int(args.get("model_instance_device_id", 0))
        )
        self.output_names = [o.name for o in self.config.outputs]
        self.output_dtypes = {o.name: o.numpy_dtype for o in self.config.outputs}
        pb_utils.Logger.log_info(
            f"{self.config.name}: {path} on {self.session.get_providers()[0]}, "
            f"max_batch_size {self.config.max_batch_size}"
        )

    def execute(self, requests):
        responses = [None] * len(requests)
        valid: list[tuple[int, RequestInputs]] = []
        for i, request in enumerate(requests):
            try:
                arrays = {t.name(): t.as_numpy() for t in request.inputs()}
                valid.append((i, validate_request(self.config, arrays)))
            except RequestError as e:
                responses[i] = _error_response(str(e), pb_utils.TritonError.INVALID_ARG)
        # A batching model runs the whole dynamic batch at once; one without batching runs each alone.
        groups = [valid] if self.config.is_batching else [[v] for v in valid]
        for group in (g for g in groups if g):
            self._run(group, responses)
        return responses

    def _run(self, group, responses):
        inputs = [r for _, r in group]
        try:
            outputs = self.session.run(self.output_names, merge(self.config, inputs))
            outputs = dict(zip(self.output_names, outputs))
            per_request = split(outputs, inputs) if self.config.is_batching else [outputs]
        except Exception as e:  # ONNX Runtime failed on this batch: every request in it gets the error
            for i, _ in group:
                responses[i] = _error_response(f"ONNX Runtime failed: {e}", pb_utils.TritonError.INTERNAL)
            return
        for (i, _), arrays in zip(group, per_request):
            tensors = [
                pb_utils.Tensor(name, np.ascontiguousarray(a, dtype=self.output_dtypes[name]))
                for name, a in arrays.items()
            ]
            responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self):
        self.session = None


def _error_response(message: str, code) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message, code))
