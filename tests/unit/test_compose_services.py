"""The docker compose stack's services without Docker: every path, port and command that
docker-compose.yml names exists in the repository and agrees with the embedded launcher, the images
install what the code needs, and `docker-compose config` accepts the files where it is installed.
Prometheus and Grafana: test_compose_monitoring.py."""
import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from clients.model_spec import parse_config
from scripts import serve
from scripts.requirements import requirements, selected
from tests.unit.compose_files import COMPOSE, GPU_OVERRIDE, REPO, host_path, load, mounts

CONTAINER_BACKENDS = PurePosixPath("/opt/tritonserver/backends")
CONTAINER_REPOSITORY = PurePosixPath("/models")
CONTAINER_SHM_PREFIX = "batchwise_"  # one server per container, so a fixed prefix is enough
NATIVE_BACKENDS = {"python", "onnxruntime", "tensorrt"}  # carried by the Triton image itself
TRITON_IMAGE_PYTHON = (3, 10)  # the Triton 24.10 image (Ubuntu 22.04) runs its Python backend on 3.10

# Triton's HTTP and gRPC APIs and the UIs; never Triton's metrics port.
PUBLISHED = {
    ("triton", serve.DEFAULT_HTTP_PORT),
    ("triton", serve.DEFAULT_GRPC_PORT),
    ("locust-master", 8089),
    ("prometheus", 9090),
    ("grafana", 3000),
}
# Import names of installed packages where they differ from the package name.
IMPORT_NAMES = {"protobuf": "google"}


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services():
    return load(COMPOSE)["services"]


def dockerfiles(services: dict) -> dict[str, Path]:
    return {name: COMPOSE.parent / s["build"]["context"] / s["build"]["dockerfile"]
            for name, s in services.items() if "build" in s}


def dockerfile_text(path: Path) -> str:
    return path.read_text().replace("\\\n", " ")  # continuation lines joined


def installed_by(dockerfile: Path) -> list[str]:
    """The package names a Dockerfile installs through `scripts/requirements.py --only ...`."""
    found = re.findall(r"requirements\.py --only\s+([^)>&\n]+)", dockerfile_text(dockerfile))
    return [name for group in found for name in shlex.split(group)]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_every_mounted_or_built_path_is_in_the_repository(services):
    for name, service in services.items():
        for source, _ in mounts(service):
            assert source == REPO or REPO in source.parents, f"{name} mounts {source}, outside the repository"
            assert source.exists(), f"{name} mounts {source}, which does not exist"
    for name, dockerfile in dockerfiles(services).items():
        assert dockerfile.is_file(), f"{name} builds from {dockerfile}, which does not exist"


def test_dockerfiles_copy_files_that_exist_and_that_their_ignore_files_let_through(services):
    for name, dockerfile in dockerfiles(services).items():
        context = COMPOSE.parent / services[name]["build"]["context"]
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
        allowed = {ln[1:] for ln in ignore.read_text().splitlines() if ln.startswith("!")}
        copies = re.findall(r"^COPY\s+(?!--from)(.+)$", dockerfile_text(dockerfile), re.MULTILINE)
        assert copies, f"{dockerfile} copies nothing"
        for sources in copies:
            for source in sources.split()[:-1]:
                assert (context / source).exists(), f"{dockerfile} copies {source}, which does not exist"
                assert source in allowed, f"{ignore} keeps {source}, which {dockerfile} copies, out of the context"


def test_dockerfiles_install_packages_pinned_in_pyproject(services):
    for name, dockerfile in dockerfiles(services).items():
        names = installed_by(dockerfile)
        assert names, f"{dockerfile} installs no pinned package"
        assert len(selected(names)) == len(names)  # SystemExit names an unpinned one


def test_build_arguments_that_dockerfiles_need_are_given(services):
    for name, dockerfile in dockerfiles(services).items():
        needed = re.findall(r"^ARG\s+(\w+)\s*$", dockerfile.read_text(), re.MULTILINE)  # no default
        given = services[name]["build"].get("args", {})
        for arg in needed:
            assert given.get(arg), f"{dockerfile} needs build argument {arg}; {name} does not give it"
    assert services["triton"]["build"]["args"]["TRITON_IMAGE"].startswith("nvcr.io/nvidia/tritonserver:")


def test_only_api_and_ui_ports_are_published_on_loopback_by_default(raw, services):
    published = set()
    for name, service in services.items():
        for raw_port, port in zip(raw["services"][name].get("ports", []), service.get("ports", [])):
            assert raw_port.startswith("${BATCHWISE_BIND:-127.0.0.1}:"), f"{name}: {raw_port!r}"
            address, _, container_port = port.split(":")
            assert address == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.add((name, int(container_port)))
    assert published == PUBLISHED
    assert ("triton", serve.DEFAULT_METRICS_PORT) not in published


def test_triton_runs_with_the_launchers_flags(services):
    triton = services["triton"]
    opts = serve.ServerOptions(model_repository=CONTAINER_REPOSITORY, host="0.0.0.0")
    expected = serve.server_command(Path("tritonserver"), CONTAINER_BACKENDS, opts, CONTAINER_SHM_PREFIX)
    assert triton["command"] == expected
    assert host_path(triton, CONTAINER_REPOSITORY) == REPO / "model_repository"


def test_every_model_backend_is_native_or_mounted(services):
    triton = services["triton"]
    for target in (t for _, t in mounts(triton) if t.parent == CONTAINER_BACKENDS):
        assert target.name not in NATIVE_BACKENDS, f"{target} would shadow Triton's native backend"
    configs = sorted((REPO / "model_repository").glob("*/config.pbtxt"))
    assert configs
    for config_path in configs:
        backend = parse_config(config_path.read_text()).backend
        if backend in NATIVE_BACKENDS:
            continue
        mounted = host_path(triton, CONTAINER_BACKENDS / backend)
        assert (mounted / "model.py").is_file(), f"{config_path}: backend {backend!r} has no model.py in {mounted}"


def container_python_roots(triton: dict) -> list[Path]:
    """Folders whose Python code runs in Triton's Python backend: mounted backends and python models."""
    roots = [source for source, target in mounts(triton) if target.parent == CONTAINER_BACKENDS]
    for config_path in (REPO / "model_repository").glob("*/config.pbtxt"):
        if parse_config(config_path.read_text()).backend == "python":
            roots += [d for d in config_path.parent.iterdir() if d.is_dir() and d.name.isdigit()]
    return roots


def test_container_python_code_imports_only_what_the_triton_image_has(services):
    installed = set()
    for name in installed_by(dockerfiles(services)["triton"]):
        package = re.match(r"[A-Za-z0-9._-]+", name).group(0).lower()
        installed.add(IMPORT_NAMES.get(package, package.replace("-", "_")))
    stdlib = set(sys.stdlib_module_names) - {"tomllib"}  # tomllib is new in 3.11
    roots = container_python_roots(services["triton"])
    assert len(roots) >= 2
    for root in roots:
        local = {p.stem for p in root.glob("*.py")} | {d.name for d in root.iterdir() if d.is_dir()}
        allowed = stdlib | local | installed | {"triton_python_backend_utils"}
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path), feature_version=TRITON_IMAGE_PYTHON)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                else:
                    continue
                for module in names:
                    top = module.split(".")[0]
                    assert top in allowed, f"{path} imports {module}, which the Triton image does not install"


def test_the_python_backend_gets_enough_shared_memory(services):
    size = services["triton"]["shm_size"].lower()
    value, unit = re.fullmatch(r"(\d+)\s*([kmg]?)b?", size).groups()
    assert int(value) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit] >= 2**30


def test_triton_waits_for_the_export_and_is_health_checked(services):
    triton = services["triton"]
    assert triton["depends_on"]["export"]["condition"] == "service_completed_successfully"
    probe = " ".join(triton["healthcheck"]["test"])
    assert f"127.0.0.1:{serve.DEFAULT_HTTP_PORT}/v2/health/ready" in probe
    assert services["locust-master"]["depends_on"]["triton"]["condition"] == "service_healthy"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_export_service_runs_make_export_without_its_venv_step(services):
    export = services["export"]
    assert host_path(export, export["working_dir"]) == REPO
    script = export["command"][-1]
    make_args = shlex.split(script.split("&&")[0])
    assert make_args[0] == "make" and "export" in make_args
    steps = subprocess.run([*make_args, "-n"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "scripts/export_onnx.py" in steps and "scripts/make_decoder_weights.py" in steps
    assert "pip" not in steps and "venv" not in steps, f"the export would set up a venv:\n{steps}"
    for script_path in re.findall(r"scripts/\w+\.py", steps):
        assert (REPO / script_path).is_file()


def test_locust_master_and_workers_run_one_locustfile_that_exists(services):
    master, worker = services["locust-master"], services["locust-worker"]
    locustfile = flag(master["command"], "-f")
    assert flag(worker["command"], "-f") == locustfile
    assert host_path(master, PurePosixPath("/work") / locustfile).is_file(), f"{locustfile} does not exist"
    assert "--master" in master["command"] and "--worker" in worker["command"]
    assert flag(worker["command"], "--master-host") == "locust-master"
    assert flag(master["command"], "--host") == f"http://triton:{serve.DEFAULT_HTTP_PORT}"


def test_the_master_expects_as_many_workers_as_compose_scales_to(raw, services):
    # An open-loop rate is split across --expect-workers: one worker by default, and the variable
    # that README's `--scale locust-worker=N` line sets beside N.
    raw_command = raw["services"]["locust-master"]["command"]
    assert flag(raw_command, "--expect-workers") == "${LOCUST_WORKERS:-1}"
    assert flag(services["locust-master"]["command"], "--expect-workers") == "1"
    readme = (REPO / "README.md").read_text()
    assert re.search(r"LOCUST_WORKERS=(\d+) docker compose up --scale locust-worker=\1\b", readme)


def test_gpu_override_reserves_gpus_for_triton_only():
    override = load(GPU_OVERRIDE)["services"]
    assert set(override) == {"triton"}
    (device,) = override["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_requirements_only_prints_the_pins_of_the_named_packages():
    pins = {re.split(r"[\[=<>]", r)[0]: r for r in requirements(["export", "test"], no_deps=False)}
    version = pins["tritonclient"].split("==")[1]
    assert selected(["numpy", "tritonclient[grpc]", "Torch"]) == \
        [pins["numpy"], f"tritonclient[grpc]=={version}", pins["torch"]]
    with pytest.raises(SystemExit, match="not pinned"):
        selected(["no-such-package"])
    with pytest.raises(SystemExit, match="without a version"):
        selected(["numpy==1.0"])


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, GPU_OVERRIDE]], ids=["cpu", "gpu"])
def test_docker_compose_accepts_the_files(files):
    compose_bin = shutil.which("docker-compose")  # Debian's 1.29: CI's validator, no Docker engine needed
    if compose_bin is None:
        if os.environ.get("BATCHWISE_REQUIRE_COMPOSE") == "1":
            pytest.fail("BATCHWISE_REQUIRE_COMPOSE=1 but docker-compose is not on PATH "
                        "(Debian: apt-get install docker-compose)")
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    args = [compose_bin, "--project-directory", str(REPO)]
    for f in files:
        args += ["-f", str(f)]
    result = subprocess.run([*args, "config", "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
