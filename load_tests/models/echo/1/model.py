"""Triton edge of `echo`: each request's text tensor back as its output, nothing else."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        texts = [pb_utils.get_input_tensor_by_name(r, "text").as_numpy() for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("echo", t)]) for t in texts]
