// metal_accel._mps_ext: compile MSL into MTLLibrary objects and launch their kernels on PyTorch's
// current MPS stream. Built by setup.py on macOS only (manual reference counting, as PyTorch's own
// MPS code: its headers hold Objective-C members and are not written for ARC).
//
// UNVERIFIED ON REAL HARDWARE until tests/test_mps_backend.py has run on a Mac (docs/metal.md).
// It follows PyTorch's aten/src/ATen/native/mps/OperationUtils.mm (MetalShaderLibrary and
// MetalKernelFunction) call for call:
//   - encode inside the stream's serial dispatch queue, with the stream's own compute encoder
//     (stream->commandEncoder(), which PyTorch coalesces kernels into; a second encoder on the same
//     command buffer crashes);
//   - bind a tensor as its MTLBuffer at byte offset storage_offset * element_size (mtl_setBuffer);
//   - bind numbers with setBytes (a copy is taken at encode time);
//   - dispatchThreads (non-uniform threadgroups) after checking the threadgroup against the
//     pipeline's maxTotalThreadsPerThreadgroup, never letting Metal clamp it.
//
// Ops (TORCH_LIBRARY metal_accel_ext); `key` is the Python side's sha256 of the source:
//   compile_library(str key, str source) -> str        kernel names, '\n'-separated
//   load_metallib(str key, str path) -> str             same, from a .metallib file
//   kernel_info(str key, str kernel) -> int[]           [maxTotalThreadsPerThreadgroup, threadExecutionWidth,
//                                                         staticThreadgroupMemoryLength]
//   launch(str key, str kernel, Tensor(a!)[] buffers, int[] buffer_index, Tensor scalar_bytes,
//          int[] scalar_index, int[] scalar_offset, int[] scalar_size, int[] threads, int[] group_size) -> ()
//   device_name() -> str                                MTLDevice.name
//   gpu_time_mark() -> ()                               a completion handler on the stream's current command
//                                                        buffer adds its GPUEndTime - GPUStartTime to a total
//   gpu_time_take() -> float[]                           [GPU seconds, command buffers] since the last take
//                                                        (then reset); call after torch.mps.synchronize()
//   (gpu_time_*: the synthesis profile of issue 30; UNTESTED ON REAL HARDWARE, docs/metal.md)
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/mps/MPSDevice.h>
#include <ATen/mps/MPSStream.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace metal_accel_ext {
namespace {

constexpr int64_t kMaxBufferIndex = 31;  // Metal's buffer argument table
constexpr int64_t kMaxSetBytes = 4096;   // setBytes:length:atIndex: limit

std::mutex g_mutex;  // guards both caches; objects in them are retained for the life of the process
std::unordered_map<std::string, id<MTLLibrary>> g_libraries;
std::unordered_map<std::string, id<MTLComputePipelineState>> g_pipelines;

// at::mps::dispatch_sync_with_rethrow has no TORCH_API export and has moved between namespaces
// across releases; this is the same function.
void dispatch_sync_with_rethrow(dispatch_queue_t queue, void (^block)()) {
  __block std::optional<std::exception_ptr> block_exception;
  dispatch_sync(queue, ^() {
    try {
      block();
    } catch (...) {
      block_exception = std::current_exception();
    }
  });
  if (block_exception) {
    std::rethrow_exception(*block_exception);
  }
}

// The MPS allocator's storage pointer is the id<MTLBuffer> (PyTorch's getMTLBufferStorage).
inline id<MTLBuffer> buffer_of(const at::Tensor& t) {
  return __builtin_bit_cast(id<MTLBuffer>, t.storage().data());
}

id<MTLDevice> device() {
  return at::mps::MPSDevice::getInstance()->device();
}

std::string to_std(NSString* s) {
  return s != nil ? std::string([s UTF8String]) : std::string();
}

// MSL 3.1 with safe math and precise functions on every supported macOS: a kernel proven on
// macOS 14 compiles the same on 15 (PyTorch's compile_shader instead picks 3.1 / 3.2 / 4.0 by OS).
MTLCompileOptions* compile_options() {
  MTLCompileOptions* options = [[MTLCompileOptions new] autorelease];
#if defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 140000
  options.languageVersion = MTLLanguageVersion3_1;
#else
#error "metal_accel._mps_ext needs the macOS 14 SDK or newer (MSL 3.1)"
#endif
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
  if (@available(macOS 15.0, *)) {
    options.mathMode = MTLMathModeSafe;
    options.mathFloatingPointFunctions = MTLMathFloatingPointFunctionsPrecise;
    return options;
  }
#endif
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
  options.fastMathEnabled = NO;
#pragma clang diagnostic pop
  return options;
}

std::string function_names(id<MTLLibrary> lib) {
  std::string out;
  @autoreleasepool {
    for (NSString* name in [lib functionNames]) {
      out += to_std(name);
      out += '\n';
    }
  }
  return out;
}

// Caller holds g_mutex.
id<MTLComputePipelineState> pipeline_locked(const std::string& key, const std::string& kernel) {
  const std::string pkey = key + std::string(1, '\0') + kernel;
  auto found = g_pipelines.find(pkey);
  if (found != g_pipelines.end()) {
    return found->second;
  }
  auto lib = g_libraries.find(key);
  TORCH_CHECK(lib != g_libraries.end(), "metal_accel: library ", key, " was not compiled in this process");
  id<MTLComputePipelineState> pso = nil;
  std::string error_text;
  @autoreleasepool {
    id<MTLFunction> fn = [lib->second newFunctionWithName:[NSString stringWithUTF8String:kernel.c_str()]];
    if (fn == nil) {
      error_text = "no function named " + kernel + " in the library";
    } else {
      NSError* error = nil;
      pso = [device() newComputePipelineStateWithFunction:fn error:&error];
      if (pso == nil) {
        error_text = error != nil ? to_std([error localizedDescription]) : "unknown error";
      }
      [fn release];
    }
  }
  TORCH_CHECK(pso != nil, "metal_accel: cannot create the compute pipeline of ", kernel, ": ", error_text);
  g_pipelines[pkey] = pso;
  return pso;
}

std::string compile_library(std::string key, std::string source) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto found = g_libraries.find(key);
  if (found != g_libraries.end()) {
    return function_names(found->second);
  }
  id<MTLLibrary> lib = nil;
  std::string error_text;
  @autoreleasepool {
    NSString* src = [NSString stringWithUTF8String:source.c_str()];
    if (src == nil) {
      error_text = "the source is not valid UTF-8";
    } else {
      NSError* error = nil;
      lib = [device() newLibraryWithSource:src options:compile_options() error:&error];
      if (lib == nil) {
        error_text = error != nil ? to_std([error localizedDescription]) : "unknown error";
      }
    }
  }
  TORCH_CHECK(lib != nil, "Metal compilation failed:\n", error_text);
  g_libraries[key] = lib;
  return function_names(lib);
}

std::string load_metallib(std::string key, std::string path) {
  std::lock_guard<std::mutex> guard(g_mutex);
  auto found = g_libraries.find(key);
  if (found != g_libraries.end()) {
    return function_names(found->second);
  }
  id<MTLLibrary> lib = nil;
  std::string error_text;
  @autoreleasepool {
    NSURL* url = [NSURL fileURLWithPath:[NSString stringWithUTF8String:path.c_str()]];
    NSError* error = nil;
    lib = [device() newLibraryWithURL:url error:&error];
    if (lib == nil) {
      error_text = error != nil ? to_std([error localizedDescription]) : "unknown error";
    }
  }
  TORCH_CHECK(lib != nil, "cannot load metallib ", path, ": ", error_text);
  g_libraries[key] = lib;
  return function_names(lib);
}

std::vector<int64_t> kernel_info(std::string key, std::string kernel) {
  std::lock_guard<std::mutex> guard(g_mutex);
  id<MTLComputePipelineState> pso = pipeline_locked(key, kernel);
  return {static_cast<int64_t>([pso maxTotalThreadsPerThreadgroup]), static_cast<int64_t>([pso threadExecutionWidth]),
          static_cast<int64_t>([pso staticThreadgroupMemoryLength])};
}

MTLSize size3(at::IntArrayRef v) {
  return MTLSizeMake(static_cast<NSUInteger>(v[0]), v.size() > 1 ? static_cast<NSUInteger>(v[1]) : 1,
                     v.size() > 2 ? static_cast<NSUInteger>(v[2]) : 1);
}

void launch(std::string key, std::string kernel, at::TensorList buffers, at::IntArrayRef buffer_index,
            const at::Tensor& scalar_bytes, at::IntArrayRef scalar_index, at::IntArrayRef scalar_offset,
            at::IntArrayRef scalar_size, at::IntArrayRef threads, at::IntArrayRef group_size) {
  TORCH_CHECK(!threads.empty() && threads.size() <= 3 && group_size.size() == threads.size(), "kernel ", kernel,
              ": threads and group_size must both have 1 to 3 dimensions, got ", threads, " and ", group_size);
  TORCH_CHECK(buffers.size() == buffer_index.size(), "kernel ", kernel, ": one buffer index per tensor");
  TORCH_CHECK(scalar_index.size() == scalar_offset.size() && scalar_index.size() == scalar_size.size(), "kernel ",
              kernel, ": one index, offset and size per scalar argument");
  TORCH_CHECK(scalar_bytes.device().is_cpu() && scalar_bytes.scalar_type() == at::kByte &&
                  scalar_bytes.is_contiguous(),
              "kernel ", kernel, ": scalar_bytes must be a contiguous uint8 CPU tensor");
  for (const auto i : c10::irange(buffers.size())) {
    const at::Tensor& t = buffers[i];
    TORCH_CHECK(t.device().is_mps(), "kernel ", kernel, ", argument ", buffer_index[i], ": tensor is on ",
                t.device(), ", not on the MPS device");
    TORCH_CHECK(buffer_index[i] >= 0 && buffer_index[i] < kMaxBufferIndex, "kernel ", kernel, ": buffer index ",
                buffer_index[i], " out of range");
  }
  for (const auto i : c10::irange(scalar_index.size())) {
    TORCH_CHECK(scalar_index[i] >= 0 && scalar_index[i] < kMaxBufferIndex, "kernel ", kernel, ": buffer index ",
                scalar_index[i], " out of range");
    TORCH_CHECK(scalar_size[i] > 0 && scalar_size[i] <= kMaxSetBytes && scalar_offset[i] >= 0 &&
                    scalar_offset[i] + scalar_size[i] <= scalar_bytes.numel(),
                "kernel ", kernel, ", argument ", scalar_index[i], ": bad scalar bytes");
  }
  for (const auto v : threads) {
    TORCH_CHECK(v >= 0 && v < (int64_t(1) << 32), "kernel ", kernel, ": threads ", threads, " out of range");
  }
  id<MTLComputePipelineState> pso = nil;
  {
    std::lock_guard<std::mutex> guard(g_mutex);
    pso = pipeline_locked(key, kernel);
  }
  const MTLSize grid = size3(threads);
  const MTLSize group = size3(group_size);
  const uint64_t group_total = uint64_t(group.width) * group.height * group.depth;
  const uint64_t max_total = [pso maxTotalThreadsPerThreadgroup];
  TORCH_CHECK(group_total >= 1 && group_total <= max_total, "kernel ", kernel, ": threadgroup size ", group_size,
              " exceeds the pipeline's maxTotalThreadsPerThreadgroup (", max_total, ")");
  if (uint64_t(grid.width) * grid.height * grid.depth == 0) {
    return;
  }
  const uint8_t* bytes = scalar_bytes.data_ptr<uint8_t>();
  at::mps::MPSStream* stream = at::mps::getCurrentMPSStream();
  dispatch_sync_with_rethrow(stream->queue(), ^() {
    @autoreleasepool {
      id<MTLComputeCommandEncoder> encoder = stream->commandEncoder();
      [encoder setComputePipelineState:pso];
      for (const auto i : c10::irange(buffers.size())) {
        const at::Tensor& t = buffers[i];
        [encoder setBuffer:buffer_of(t)
                    offset:static_cast<NSUInteger>(t.storage_offset() * t.element_size())
                   atIndex:static_cast<NSUInteger>(buffer_index[i])];
      }
      for (const auto i : c10::irange(scalar_index.size())) {
        [encoder setBytes:bytes + scalar_offset[i]
                   length:static_cast<NSUInteger>(scalar_size[i])
                  atIndex:static_cast<NSUInteger>(scalar_index[i])];
      }
      [encoder dispatchThreads:grid threadsPerThreadgroup:group];
    }
  });
}

std::mutex g_time_mutex;
double g_gpu_seconds = 0.0;  // guarded by g_time_mutex, written by completion handlers on Metal's threads
int64_t g_gpu_buffers = 0;

void gpu_time_mark() {
  // MPSStream::addCompletedHandler adds the block to the stream's current command buffer (creating one
  // if none is open) on its serial queue, as PyTorch's own MPS events and profiler do.
  at::mps::getCurrentMPSStream()->addCompletedHandler(^(id<MTLCommandBuffer> buffer) {
    const double seconds = [buffer GPUEndTime] - [buffer GPUStartTime];
    std::lock_guard<std::mutex> guard(g_time_mutex);
    if (seconds > 0) {
      g_gpu_seconds += seconds;
    }
    g_gpu_buffers += 1;
  });
}

std::vector<double> gpu_time_take() {
  std::lock_guard<std::mutex> guard(g_time_mutex);
  std::vector<double> out{g_gpu_seconds, static_cast<double>(g_gpu_buffers)};
  g_gpu_seconds = 0.0;
  g_gpu_buffers = 0;
  return out;
}

std::string device_name() {
  @autoreleasepool {
    return to_std([device() name]);
  }
}

}  // namespace
}  // namespace metal_accel_ext

TORCH_LIBRARY(metal_accel_ext, m) {
  m.def("compile_library(str key, str source) -> str", &metal_accel_ext::compile_library);
  m.def("load_metallib(str key, str path) -> str", &metal_accel_ext::load_metallib);
  m.def("kernel_info(str key, str kernel) -> int[]", &metal_accel_ext::kernel_info);
  m.def("launch(str key, str kernel, Tensor(a!)[] buffers, int[] buffer_index, Tensor scalar_bytes, "
        "int[] scalar_index, int[] scalar_offset, int[] scalar_size, int[] threads, int[] group_size) -> ()",
        &metal_accel_ext::launch);
  m.def("device_name() -> str", &metal_accel_ext::device_name);
  m.def("gpu_time_mark() -> ()", &metal_accel_ext::gpu_time_mark);
  m.def("gpu_time_take() -> float[]", &metal_accel_ext::gpu_time_take);
}

// An importable, empty Python module: importing it runs the TORCH_LIBRARY registration above
// (the pattern of pytorch/extension-cpp).
extern "C" PyObject* PyInit__mps_ext(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_mps_ext", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
