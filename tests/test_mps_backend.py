"""The Metal backend ("mps"): launch arguments, caching, environment and timing with a fake
torch.mps.compile_shader and a fake extension (CPU); the launch convention shared with the MSL
emulator; emulator-proven entries that a Mac must re-prove; and, marked `mps`, the real device."""
from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import metal_accel
from metal_accel import blocks, demo
from metal_accel.store import cache as cache_mod
from metal_accel.backends import known_backends
from metal_accel.backends.mps import backend as mps
from metal_accel.backends.mps.backend import MpsBackend, launch_geometry, pack_arguments, pack_scalar
from metal_accel.proof.speed import TimingRejected
from metal_accel.store.cache import CacheDir, CacheEntry
from metal_accel.core.candidate import parse_candidate
from metal_accel.core.errors import CompileError, KernelLaunchError
from metal_accel.core.keys import entry_key
from metal_accel.runtime.ops import ModuleLayout
from metal_accel.proof.prove import kernels_only
from metal_accel.store.retarget import for_device, for_real_device
from metal_accel.sandbox.host import load_forward

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels_src" / "mps"
SHIPPED = ROOT / "metal_accel" / "kernels_cache" / "mps"
HAS_MPS = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()

SILU = """
#include <metal_stdlib>
using namespace metal;
kernel void silu_mul(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                     device float* out [[buffer(2)]], constant uint& n [[buffer(3)]],
                     uint i [[thread_position_in_grid]]) {
    if (i < n) { float x = a[i]; out[i] = x / (1.0f + exp(-x)) * b[i]; }
}
"""


def candidate(name: str, backend: str = "mps"):
    path = KERNELS / f"{name}.py"
    return parse_candidate(path.read_text(), backend, f"dir:{path}")


# ---------------------------------------------------------------- fakes

class FakeKernel:
    def __init__(self, lib: "FakeLibrary", name: str) -> None:
        self.lib, self.name = lib, name
        self.max_threads_per_threadgroup = lib.max_threads
        self.thread_execution_width = 32

    def __call__(self, *args: Any, threads: Any = None, group_size: Any = None, arg_casts: Any = None) -> None:
        self.lib.calls.append((self.name, args, threads, group_size, arg_casts))
        if self.lib.delegate is not None:  # run the launch on the emulator: results can be compared
            getattr(self.lib.delegate, self.name)(*args, threads=threads, group_size=group_size, arg_casts=arg_casts)


class FakeLibrary:
    """What torch.mps.compile_shader returns: kernels by attribute, their names from dir()."""

    def __init__(self, source: str, max_threads: int, delegate: Any, list_names: bool) -> None:
        self._names = mps.kernel_names_in(source) if list_names else []
        self.max_threads, self.delegate, self.calls = max_threads, delegate, []

    def __dir__(self) -> list[str]:
        return list(self._names)

    def __getattr__(self, name: str) -> FakeKernel:
        if name.startswith("_"):
            raise AttributeError(name)
        return FakeKernel(self, name)


class FakeCompileShader:
    def __init__(self, max_threads: int = 1024, emulate: bool = False, list_names: bool = True) -> None:
        self.max_threads, self.emulate, self.list_names = max_threads, emulate, list_names
        self.sources: list[str] = []
        self.libs: list[FakeLibrary] = []

    def __call__(self, source: str) -> FakeLibrary:
        self.sources.append(source)
        if "SYNTAX_ERROR" in source:
            raise SyntaxError("program_source:4:5: error: use of undeclared identifier 'SYNTAX_ERROR'")
        delegate = None
        if self.emulate:
            from metal_accel.backends import get_backend
            delegate = get_backend("mps-emu").compile(source)
        lib = FakeLibrary(source, self.max_threads, delegate, self.list_names)
        self.libs.append(lib)
        return lib


class FakeExtOps:
    """torch.ops.metal_accel_ext as the extension registers it."""

    def __init__(self, max_threads: int = 512) -> None:
        self.max_threads = max_threads
        self.launches: list[tuple] = []
        self.compiled: dict[str, str] = {}

    def compile_library(self, key: str, source: str) -> str:
        if "SYNTAX_ERROR" in source:
            raise RuntimeError("Metal compilation failed:\nprogram_source:2:1: error: unknown type name 'SYNTAX_ERROR'")
        self.compiled[key] = source
        return "\n".join(mps.kernel_names_in(source)) + "\n"

    def kernel_info(self, key: str, kernel: str) -> list[int]:
        return [self.max_threads, 32, 0]

    def launch(self, *args: Any) -> None:
        self.launches.append(args)

    def device_name(self) -> str:
        return "Apple M9"


@pytest.fixture
def fake_mps(monkeypatch: pytest.MonkeyPatch):
    """The mps backend on this machine: MPS reported present, compile_shader faked, no extension;
    tensors are CPU tensors (device_type "cpu")."""
    shader = FakeCompileShader()
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(mps, "_compile_shader", lambda: shader)
    monkeypatch.setattr(mps, "extension", lambda: None)
    monkeypatch.setattr(mps, "_has_events", lambda: False)  # the fake device is the CPU: wall clock,
    monkeypatch.setattr(MpsBackend, "synchronize", lambda self: None)  # nothing to synchronize
    monkeypatch.delenv("METAL_ACCEL_MPS_LAUNCHER", raising=False)
    mps.clear_memory_cache()
    mps._environment.cache_clear()
    yield SimpleNamespace(shader=shader, backend=dataclasses.replace(MpsBackend(), device_type="cpu"))
    mps.clear_memory_cache()
    mps._environment.cache_clear()


# ---------------------------------------------------------------- registry and availability

def test_registered_and_unavailable_without_a_mac() -> None:
    assert "mps" in known_backends()
    be = MpsBackend()
    assert (be.name, be.device_type, be.language) == ("mps", "mps", "msl")
    if not HAS_MPS:
        assert not be.is_available()


def test_available_with_compile_shader_or_extension(fake_mps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert fake_mps.backend.is_available()
    monkeypatch.setattr(mps, "_compile_shader", lambda: None)
    assert not fake_mps.backend.is_available()  # PyTorch < 2.7 and no extension
    monkeypatch.setattr(mps, "extension", lambda: FakeExtOps())
    assert fake_mps.backend.is_available()
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert not fake_mps.backend.is_available()


# ---------------------------------------------------------------- compiling and caching

def test_libraries_cached_by_source_hash(fake_mps: Any) -> None:
    be = fake_mps.backend
    before = mps.compile_count
    lib = be.compile(SILU)
    assert be.compile(SILU) is lib
    assert mps.compile_count == before + 1 and len(fake_mps.shader.sources) == 1
    other = be.compile(SILU.replace("1.0f", "1.00f"))
    assert other is not lib and len(fake_mps.shader.sources) == 2
    assert lib.kernel_names == ("silu_mul",) and lib.launcher == "compile_shader"
    assert lib.silu_mul.max_threads_per_threadgroup == 1024 and lib.silu_mul.thread_execution_width == 32
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        lib.nope
    with pytest.raises(AttributeError):
        lib.silu_mul = None


def test_compile_errors_carry_the_metal_message(fake_mps: Any) -> None:
    with pytest.raises(CompileError, match="use of undeclared identifier 'SYNTAX_ERROR'"):
        fake_mps.backend.compile(SILU + "\nSYNTAX_ERROR\n")
    with pytest.raises(CompileError, match="no kernel found"):
        fake_mps.backend.compile("#include <metal_stdlib>\ninline float f(float x) { return x; }\n")
    with pytest.raises(CompileError, match="empty"):
        fake_mps.backend.compile("  ")


def test_source_sent_as_ascii_and_names_found_without_dir(monkeypatch: pytest.MonkeyPatch, fake_mps: Any) -> None:
    lib = fake_mps.backend.compile(SILU.replace("using namespace", "// silu(a) \u00b7 b \u2014 fused\nusing namespace"))
    assert fake_mps.shader.sources[-1].isascii() and "silu(a) ? b ? fused" in fake_mps.shader.sources[-1]
    assert lib.kernel_names == ("silu_mul",)
    shader = FakeCompileShader(list_names=False)  # a PyTorch whose library has no __dir__
    monkeypatch.setattr(mps, "_compile_shader", lambda: shader)
    src = SILU + '\n[[kernel]] void other(device float* o [[buffer(0)]]) {}\n'
    assert fake_mps.backend.compile(src).kernel_names == ("silu_mul", "other")


# ---------------------------------------------------------------- launch arguments

@pytest.mark.parametrize("threads, group, default, expect", [
    (None, None, 100, ([100], [100])),
    (5000, None, None, ([5000], [1024])),
    ([64, 8], None, None, ([64, 8], [1024, 1])),
    ((64, 8, 2), (8, 8, 2), None, ([64, 8, 2], [8, 8, 2])),
    (0, None, None, None),            # an empty grid runs nothing
    ([0, 4], [1, 1], None, None),
])
def test_launch_geometry(threads: Any, group: Any, default: Any, expect: Any) -> None:
    assert launch_geometry("k", threads, group, default, 1024) == expect


@pytest.mark.parametrize("threads, group, default, match", [
    (None, None, None, "undefined"),
    (64, 2048, None, "exceeds the 1024-thread limit"),
    ([64, 64], [64, 32], None, "exceeds the 1024-thread limit"),
    ([64, 8], 64, None, "same number of dimensions"),
    (64, 0, None, "zero dimension"),
    ([1, 2, 3, 4], None, None, "1 to 3"),
    (-1, None, None, "non-negative"),
    (2 ** 32, None, None, "below 2\\*\\*32"),
    ("many", None, None, "must be an int"),
])
def test_launch_geometry_errors(threads: Any, group: Any, default: Any, match: str) -> None:
    with pytest.raises(KernelLaunchError, match=match):
        launch_geometry("k", threads, group, default, 1024)


def test_kernel_normalizes_and_passes_arguments_unchanged(fake_mps: Any) -> None:
    lib = fake_mps.backend.compile(SILU)
    a, b, out = torch.randn(300), torch.randn(300), torch.empty(300)
    lib.silu_mul(a, b, out, 300)
    lib.silu_mul(a, b, out, 300, threads=300, group_size=64, arg_casts={3: "int32"})
    (n1, args1, t1, g1, c1), (_, args2, t2, g2, c2) = fake_mps.shader.libs[0].calls
    assert n1 == "silu_mul" and args1[0] is a and args1[1] is b and args1[2] is out and args1[3] == 300
    assert (t1, g1, c1) == ([300], [300], None)  # default threads: the first tensor's numel
    assert (t2, g2, c2) == ([300], [64], {3: "int32"})
    lib.silu_mul(torch.empty(0), b, out, 0)  # empty grid: not launched
    assert len(fake_mps.shader.libs[0].calls) == 2


def test_threadgroup_over_the_pipeline_limit_is_an_error(fake_mps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    shader = FakeCompileShader(max_threads=256)  # a pipeline with many registers reports less than 1024
    monkeypatch.setattr(mps, "_compile_shader", lambda: shader)
    lib = fake_mps.backend.compile(SILU)
    a = torch.randn(1000)
    with pytest.raises(KernelLaunchError, match="maxTotalThreadsPerThreadgroup"):
        lib.silu_mul(a, a, a, 1000, threads=1000, group_size=512)
    assert shader.libs[0].calls == []  # never reaches Metal, which would clamp it
    lib.silu_mul(a, a, a, 1000)
    assert shader.libs[0].calls[0][2:4] == ([1000], [256])


def test_tensors_must_be_on_the_device(monkeypatch: pytest.MonkeyPatch, fake_mps: Any) -> None:
    lib = MpsBackend().compile(SILU)  # device_type "mps"
    with pytest.raises(KernelLaunchError, match="tensor is on cpu"):
        lib.silu_mul(torch.randn(4), torch.randn(4), torch.empty(4), 4)


def test_pack_scalar_matches_compile_shader() -> None:
    assert pack_scalar("k", 0, 7, None) == struct.pack("<q", 7)
    assert pack_scalar("k", 0, True, None) == struct.pack("<q", 1)  # bool is an int (pybind11)
    assert pack_scalar("k", 0, 0.5, None) == struct.pack("<f", 0.5)
    assert pack_scalar("k", 0, [1, 2, 3], None) == struct.pack("<3q", 1, 2, 3)
    assert pack_scalar("k", 0, (0.5, 2), None) == struct.pack("<2f", 0.5, 2.0)
    assert pack_scalar("k", 0, 1.5, "fp16") == struct.pack("<e", 1.5)
    assert pack_scalar("k", 0, 1.5, "bf16") == torch.tensor([1.5], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
    assert pack_scalar("k", 0, -1, "int32") == struct.pack("<i", -1)
    assert pack_scalar("k", 0, 2 ** 32 + 5, "int32") == struct.pack("<i", 5)  # static_cast wraps
    assert pack_scalar("k", 0, [300, 1], "uint8") == bytes([44, 1])
    for bad, match in (([], "empty list"), ([1, 0.5], "unsupported argument"), ("x", "unsupported argument"),
                       ([torch.ones(1)], "argument buffers")):
        with pytest.raises(KernelLaunchError, match=match):
            pack_scalar("k", 3, bad, None)
    with pytest.raises(KernelLaunchError, match="unsupported cast"):
        pack_scalar("k", 0, 1, "fp64")


def test_extension_launcher(fake_mps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = FakeExtOps(max_threads=512)
    monkeypatch.setattr(mps, "extension", lambda: ops)
    lib = fake_mps.backend.compile(SILU)
    assert lib.launcher == "metal_accel._mps_ext" and lib.silu_mul.max_threads_per_threadgroup == 512
    assert fake_mps.shader.sources == []  # the extension is preferred when built
    a, b, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    lib.silu_mul(a, b, out, 1000, threads=1000)
    key, name, buffers, buffer_index, blob, scalar_index, offsets, sizes, grid, group = ops.launches[0]
    assert key == lib.key and key in ops.compiled and name == "silu_mul"
    assert buffers[0] is a and buffers[1] is b and buffers[2] is out and buffer_index == [0, 1, 2]
    assert scalar_index == [3] and sizes == [8] and grid == [1000] and group == [512]
    assert blob.dtype == torch.uint8 and bytes(blob[offsets[0]:offsets[0] + 8].tolist()) == struct.pack("<q", 1000)
    with pytest.raises(KernelLaunchError, match="exceeds the 512-thread limit"):
        lib.silu_mul(a, b, out, 1000, group_size=1024)
    with pytest.raises(CompileError, match="unknown type name 'SYNTAX_ERROR'"):
        fake_mps.backend.compile(SILU + "SYNTAX_ERROR")
    monkeypatch.setenv("METAL_ACCEL_MPS_LAUNCHER", "compile_shader")
    assert fake_mps.backend.compile(SILU).launcher == "compile_shader"


def test_pack_arguments_keeps_values_aligned() -> None:
    buffers, index, blob, sidx, offsets, sizes = pack_arguments("k", (torch.ones(2), 1.5, [1, 2, 3], 7), {2: "int16"})
    assert index == [0] and sidx == [1, 2, 3] and sizes == [4, 6, 8]
    assert all(o % 16 == 0 for o in offsets)
    raw = bytes(blob.tolist())
    assert raw[offsets[1]:offsets[1] + 6] == struct.pack("<3h", 1, 2, 3)
    with pytest.raises(KernelLaunchError, match="setBytes takes at most"):
        pack_arguments("k", (list(range(600)),), None)


# ---------------------------------------------------------------- environment and timing

def test_environment(fake_mps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mps, "chip_name", lambda: "Apple M2 Pro")
    monkeypatch.setattr(mps, "gpu_cores", lambda: 19)
    monkeypatch.setattr(mps, "os_description", lambda: "macOS 15")
    env = fake_mps.backend.environment()
    assert env.backend == "mps" and env.os == "macOS 15"
    assert env.device_name == "Apple M2 Pro, 19 GPU cores, via compile_shader"
    assert env.torch == ".".join(torch.__version__.split("+")[0].split(".")[:2])
    monkeypatch.setattr(mps, "extension", lambda: FakeExtOps())
    ext_env = fake_mps.backend.environment()  # verdicts include dispatch cost: launchers do not share them
    assert ext_env.device_name.endswith("via metal_accel._mps_ext") and ext_env.id != env.id


def test_chip_name_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mps.sys, "platform", "darwin")
    monkeypatch.setattr(mps, "_sysctl", lambda name: "Apple M3 Max" if name == "machdep.cpu.brand_string" else "")
    assert mps.chip_name() == "Apple M3 Max"
    monkeypatch.setattr(mps, "_sysctl", lambda name: "")
    monkeypatch.setattr(torch.backends.mps, "get_name", lambda: "Apple M1", raising=False)
    assert mps.chip_name() == "Apple M1"


def test_timer_reports_wall_time_checked_by_events(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.mps.event as event_mod

    class FakeEvent:
        gpu_ms = 0.001

        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self) -> None:
            pass

        def elapsed_time(self, other: "FakeEvent") -> float:
            return FakeEvent.gpu_ms

    monkeypatch.setattr(event_mod, "Event", FakeEvent)
    timer = mps.event_checked_timer()
    syncs = []
    elapsed, out = timer(lambda x: x + 1, (1,), {}, lambda: syncs.append(1))
    assert out == 2 and elapsed > 0 and len(syncs) == 2  # synchronized before and after
    FakeEvent.gpu_ms = 50.0  # the GPU was busy longer than the wall clock saw: work escaped the sync
    with pytest.raises(TimingRejected, match="MPS events"):
        timer(lambda: None, (), {}, lambda: None)


# ---------------------------------------------------------------- the launch convention is the emulator's

def _run(cand_code: str, lib: Any, module: torch.nn.Module, args: tuple) -> Any:
    layout = ModuleLayout(module)
    forward = load_forward(cand_code, kernels_only(lib))
    with torch.inference_mode():
        return forward(layout.view(layout.gather()), *args)


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.stride(), value.storage_offset())
    return value


@pytest.mark.needs_cxx
@pytest.mark.parametrize("name, make", [
    ("SiluMul", lambda: (blocks.SiluMul(), (torch.randn(6, 40), torch.randn(6, 40)))),
    ("RMSNorm", lambda: (blocks._randomize(blocks.RMSNorm(96)), (torch.randn(5, 96),))),
    ("Attention", lambda: (demo.build_demo_model().blocks[0].attn, (torch.randn(2, 7, 128),))),
])
def test_same_host_code_same_calls_on_mps_and_emulator(name: str, make: Any, fake_mps: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from metal_accel.backends import get_backend
    shader = FakeCompileShader(emulate=True)
    monkeypatch.setattr(mps, "_compile_shader", lambda: shader)
    module, args = make()
    cand = candidate(name)
    emu = get_backend("mps-emu").compile(cand.source)
    emu_calls: list[tuple] = []

    class Recorder:
        kernel_names = emu.kernel_names

        def __getattr__(self, kname: str) -> Any:
            def call(*a: Any, **kw: Any) -> None:
                emu_calls.append((kname, a, kw))
                getattr(emu, kname)(*a, **kw)
            return call

    out_emu = _run(cand.code, Recorder(), module, args)
    out_mps = _run(cand.code, fake_mps.backend.compile(cand.source), module, args)
    assert torch.equal(out_emu, out_mps)
    mps_calls = shader.libs[-1].calls
    assert [c[0] for c in mps_calls] == [c[0] for c in emu_calls] and emu_calls
    for (kname, a, kw), (_, margs, threads, group, casts) in zip(emu_calls, mps_calls, strict=True):
        assert [_describe(x) for x in a] == [_describe(x) for x in margs]
        first = next((x.numel() for x in a if isinstance(x, torch.Tensor)), None)
        grid, tg = launch_geometry(kname, kw.get("threads"), kw.get("group_size"), first, 1024)
        assert (threads, group, casts) == (grid, tg, kw.get("arg_casts"))


# ---------------------------------------------------------------- emulator proofs and the Mac

def _silu_entry() -> CacheEntry:
    module, inputs = blocks.SiluMul(), (torch.randn(8, 48), torch.randn(8, 48))
    metal_accel.optimize(module, inputs, backend="mps-emu", providers=[f"dir:{KERNELS}"], strict=True)
    top = metal_accel.explain(module).modules[0]
    assert top.status == "kernel" and top.speedup is None and "speed not measured" in top.reason
    torch.testing.assert_close(module(*inputs), torch.nn.functional.silu(inputs[0]) * inputs[1], rtol=1e-5, atol=1e-6)
    (entry,) = list(cache_mod.user_cache().entries("mps-emu"))
    return entry


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_emulator_proves_correctness_only_and_retargets_for_the_mac() -> None:
    entry = _silu_entry()
    (verdict,) = entry.verdicts.values()
    assert verdict.env.backend == "mps-emu" and verdict.accepted
    assert verdict.speedup is None and verdict.eager_us is None and verdict.kernel_us is None
    assert verdict.details["speed_gate"].startswith("skipped")
    real = for_real_device(entry)
    assert real.backend == "mps" and real.candidate.backend == "mps" and real.candidate.code == entry.candidate.code
    assert all(t.device == "mps" for t in real.input_spec.tensor_specs() + list(real.output_spec.tensors))
    assert real.key == entry_key(entry.module_fingerprint, real.input_spec, "mps")
    (carried,) = real.verdicts.values()
    assert carried.env.backend == "mps-emu" and carried.speedup is None  # no speed claim anywhere
    assert carried.candidate_digest == real.candidate.digest and "correctness only" in carried.details["scope"]
    again = CacheEntry.from_dict(json.loads(json.dumps(real.to_dict())))  # sandbox and MSL checks pass on load
    assert again.key == real.key and again.verdicts.keys() == real.verdicts.keys()


@pytest.mark.slow
@pytest.mark.needs_cxx
def test_a_real_device_proves_speed_before_installing_an_emulator_proven_kernel(
        fake_mps: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No verdict for the Mac's environment: the pipeline proves correctness and speed there, once."""
    from metal_accel.pipeline import Pipeline
    from metal_accel.proof.prove import ProofSettings
    from metal_accel.runtime.capture import capture
    entry = _silu_entry()
    shader = FakeCompileShader(emulate=True)  # the "device" runs kernels through the emulator
    monkeypatch.setattr(mps, "_compile_shader", lambda: shader)
    be = fake_mps.backend
    moved = for_device(entry, "mps", be.device_type)  # an mps entry whose tensors live where be runs
    cache_mod.user_cache().put(moved)
    # eval mode, as optimize() proved it in (a module's training flag is part of its key)
    module, inputs = blocks.SiluMul().eval(), (torch.randn(8, 48), torch.randn(8, 48))
    plan = Pipeline(be, settings=ProofSettings(isolate=False, bench_budget_s=0.2), try_compile=False)
    (call,) = [c for c in capture(module, inputs, None) if c.module is module]
    rep = plan.process(call)
    mine = cache_mod.user_cache().get("mps", moved.key)
    here = mine.verdict_for(be.environment())
    assert here is not None, (rep, mine.verdicts)
    assert here.speedup is not None and here.eager_us is not None  # timed on the device
    assert here.env.backend == "mps" and any(v.env.backend == "mps-emu" for v in mine.verdicts.values())
    assert ("re-validated here" in rep.source) == here.accepted
    assert (rep.status == "kernel") == here.accepted


def test_shipped_metal_entries_claim_no_speed_without_a_mac() -> None:
    entries = list(CacheDir(SHIPPED.parent, writable=False, name="shipped").entries("mps"))
    assert entries, "kernels_cache/mps is empty: run scripts/build_shipped_cache.py --backend mps-emu"
    classes = set()
    for e in entries:
        assert e.backend == "mps" and e.candidate is not None and e.candidate.backend == "mps"
        assert all(t.device == "mps" for t in e.input_spec.tensor_specs())
        for v in e.verdicts.values():
            assert v.env.backend in ("mps", "mps-emu")
            if v.env.backend == "mps-emu":
                assert v.speedup is None and v.kernel_us is None and "correctness only" in v.details["scope"]
        name = e.module_class.rsplit(".", 1)[-1]
        assert parse_candidate((KERNELS / f"{name}.py").read_text(), "mps").code == e.candidate.code, \
            f"{name}: kernels_src/mps changed since the shipped cache was built"
        classes.add(e.module_class)
    assert {"metal_accel.demo.RMSNorm", "metal_accel.demo.Attention", "metal_accel.demo.MLP",
            "metal_accel.blocks.RMSNorm", "metal_accel.blocks.LayerNorm", "metal_accel.blocks.Softmax",
            "metal_accel.blocks.SiluMul", "metal_accel.blocks.BiasGelu", "metal_accel.blocks.Rotary",
            "metal_accel.blocks.ConvBnAct"} <= classes


# ---------------------------------------------------------------- the real device (a Mac)

LAUNCHERS = ["compile_shader", "ext"]


@pytest.fixture
def real_mps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> MpsBackend:
    which = request.param
    if which == "ext" and mps.extension() is None:
        pytest.skip("metal_accel._mps_ext is not built (pip install -e . on macOS builds it)")
    if which == "compile_shader" and mps._compile_shader() is None:
        pytest.skip("torch.mps.compile_shader needs PyTorch >= 2.7")
    monkeypatch.setenv("METAL_ACCEL_MPS_LAUNCHER", which)
    mps.clear_memory_cache()
    return MpsBackend()


@pytest.mark.mps
@pytest.mark.parametrize("real_mps", LAUNCHERS, indirect=True)
def test_real_kernel_matches_torch(real_mps: MpsBackend) -> None:
    lib = real_mps.compile(SILU)
    a, b = torch.randn(10_000, device="mps"), torch.randn(10_000, device="mps")
    out = torch.full_like(a, float("nan"))
    lib.silu_mul(a, b, out, a.numel(), threads=a.numel(), group_size=256)
    real_mps.synchronize()
    torch.testing.assert_close(out, torch.nn.functional.silu(a) * b, rtol=1e-5, atol=1e-6)
    assert real_mps.compile(SILU) is lib


@pytest.mark.mps
@pytest.mark.parametrize("real_mps", LAUNCHERS, indirect=True)
def test_real_storage_offset_and_scalar_casts(real_mps: MpsBackend) -> None:
    lib = real_mps.compile("""
#include <metal_stdlib>
using namespace metal;
kernel void axpb(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 constant half& a [[buffer(2)]], constant float& b [[buffer(3)]],
                 constant int& n [[buffer(4)]], uint i [[thread_position_in_grid]]) {
    if (i < uint(n)) y[i] = x[i] * float(a) + b;
}
""")
    base = torch.arange(40, dtype=torch.float32, device="mps")
    x = base[8:]  # storage offset 8: bound at 32 bytes into the buffer
    y = torch.empty(32, device="mps")
    lib.axpb(x, y, 2.0, 0.5, 32, arg_casts={2: "fp16", 4: "int32"})
    real_mps.synchronize()
    torch.testing.assert_close(y, x * 2 + 0.5)


@pytest.mark.mps
@pytest.mark.parametrize("real_mps", LAUNCHERS, indirect=True)
def test_real_compile_error_and_threadgroup_limit(real_mps: MpsBackend) -> None:
    with pytest.raises(CompileError, match="error"):
        real_mps.compile(SILU.replace("float x = a[i];", "float x = a[i]"))
    lib = real_mps.compile(SILU)
    limit = lib.silu_mul.max_threads_per_threadgroup
    assert 32 <= limit <= 1024 and lib.silu_mul.thread_execution_width == 32
    a = torch.randn(4096, device="mps")
    with pytest.raises(KernelLaunchError, match="limit"):
        lib.silu_mul(a, a, a, 4096, threads=4096, group_size=limit + 32)


@pytest.mark.mps
def test_real_extension_checks_the_threadgroup_itself() -> None:
    ops = mps.extension()
    if ops is None:
        pytest.skip("metal_accel._mps_ext is not built")
    key = "test-" + mps.hashlib.sha256(SILU.encode()).hexdigest()[:16]
    assert ops.compile_library(key, SILU).split() == ["silu_mul"]
    max_threads, width, _ = ops.kernel_info(key, "silu_mul")
    a = torch.randn(64, device="mps")
    with pytest.raises(RuntimeError, match="maxTotalThreadsPerThreadgroup"):
        ops.launch(key, "silu_mul", [a, a, a], [0, 1, 2], torch.zeros(8, dtype=torch.uint8), [3], [0], [8],
                   [64], [max_threads + 1])
    assert ops.device_name().startswith("Apple")


@pytest.mark.mps
def test_real_environment_and_timer() -> None:
    be = MpsBackend()
    env = be.environment()
    assert env.backend == "mps" and env.os.startswith("macOS") and "Apple" in env.device_name
    x = torch.randn(1 << 20, device="mps")
    elapsed, out = be.timer()(torch.exp, (x,), {}, be.synchronize)
    assert elapsed > 0 and out.shape == x.shape


@pytest.mark.mps
def test_real_pipeline_proves_speed_on_the_device() -> None:
    module = blocks.SiluMul().to("mps")
    inputs = (torch.randn(512, 5632, device="mps"), torch.randn(512, 5632, device="mps"))
    metal_accel.optimize(module, inputs, providers=[f"dir:{ROOT / 'kernels_src'}"], strict=True)
    top = metal_accel.explain(module).modules[0]
    assert top.speedup is not None or top.status == "eager"  # timed here; installed only if faster
    torch.testing.assert_close(module(*inputs), torch.nn.functional.silu(inputs[0]) * inputs[1])


@pytest.mark.mps
def test_real_shipped_entries_are_reproven_on_this_mac() -> None:
    model = demo.build_demo_model().to("mps")
    (ids,) = demo.demo_inputs()
    expected = model(ids.to("mps"))
    metal_accel.optimize(model, (ids.to("mps"),))
    report = metal_accel.explain(model)
    for m in report.modules:
        if m.status == "kernel":
            assert "re-validated here" in m.source or m.source.startswith("cache:user"), m
    torch.testing.assert_close(model(ids.to("mps")), expected, rtol=1e-4, atol=1e-5)
