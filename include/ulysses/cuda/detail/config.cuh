// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief Internals shared by the CUDA headers: the architecture-keyed inline namespace and the
///        conversion of CUDA runtime errors into ulysses::Error.
///
/// The kernels and their launchers live in an inline namespace named for the TU's architectures
/// (`__CUDA_ARCH_LIST__`, e.g. `ulysses::v0::sm_800_900`; CCCL's ODR guard), so that TUs built for
/// different GPUs never share a host stub; `ULYSSES_CUDA_ARCH_NAMESPACE` chooses the name. Why:
/// docs/headers.md, "cuda/detail/config.cuh".
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "../../error.hpp"

#define ULYSSES_DETAIL_PP_CAT_(a, b) a##b
#define ULYSSES_DETAIL_PP_CAT(a, b) ULYSSES_DETAIL_PP_CAT_(a, b)
#define ULYSSES_DETAIL_PP_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, N, ...) N
#define ULYSSES_DETAIL_PP_COUNT(...) \
  ULYSSES_DETAIL_PP_COUNT_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define ULYSSES_DETAIL_ARCH_1(a) sm_##a
#define ULYSSES_DETAIL_ARCH_2(a, b) sm_##a##_##b
#define ULYSSES_DETAIL_ARCH_3(a, b, c) sm_##a##_##b##_##c
#define ULYSSES_DETAIL_ARCH_4(a, b, c, d) sm_##a##_##b##_##c##_##d
#define ULYSSES_DETAIL_ARCH_5(a, b, c, d, e) sm_##a##_##b##_##c##_##d##_##e
#define ULYSSES_DETAIL_ARCH_6(a, b, c, d, e, f) sm_##a##_##b##_##c##_##d##_##e##_##f
#define ULYSSES_DETAIL_ARCH_7(a, b, c, d, e, f, g) sm_##a##_##b##_##c##_##d##_##e##_##f##_##g
#define ULYSSES_DETAIL_ARCH_8(a, b, c, d, e, f, g, h) sm_##a##_##b##_##c##_##d##_##e##_##f##_##g##_##h
#define ULYSSES_DETAIL_ARCH_MANY(...) sm_many_archs
#define ULYSSES_DETAIL_ARCH_9 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_10 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_11 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_12 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_13 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_14 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_15 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_16 ULYSSES_DETAIL_ARCH_MANY
#define ULYSSES_DETAIL_ARCH_NS(...) \
  ULYSSES_DETAIL_PP_CAT(ULYSSES_DETAIL_ARCH_, ULYSSES_DETAIL_PP_COUNT(__VA_ARGS__))(__VA_ARGS__)

/// Name of the architecture-keyed inline namespace (see docs/headers.md, "cuda/detail/config.cuh").
#ifndef ULYSSES_CUDA_ARCH_NAMESPACE
#if defined(__CUDA_ARCH_LIST__)
#define ULYSSES_CUDA_ARCH_NAMESPACE ULYSSES_DETAIL_ARCH_NS(__CUDA_ARCH_LIST__)
#else
#define ULYSSES_CUDA_ARCH_NAMESPACE sm_unknown
#endif
#endif

/// Opens `ulysses::v0::<arch namespace>` (all inline), for public types with device code.
/// Internals go in `ulysses::v0::detail::<arch namespace>` (ULYSSES_CUDA_DETAIL_BEGIN), never in
/// a `detail` inside the arch namespace: that would make every `detail::` in ulysses ambiguous.
#define ULYSSES_CUDA_NAMESPACE_BEGIN \
  ULYSSES_NAMESPACE_BEGIN            \
  inline namespace ULYSSES_CUDA_ARCH_NAMESPACE {
/// Closes what ULYSSES_CUDA_NAMESPACE_BEGIN opened.
#define ULYSSES_CUDA_NAMESPACE_END \
  }                                \
  ULYSSES_NAMESPACE_END
/// Opens `ulysses::v0::detail::<arch namespace>` (kernels and their helpers).
#define ULYSSES_CUDA_DETAIL_BEGIN \
  ULYSSES_NAMESPACE_BEGIN         \
  namespace detail {              \
  inline namespace ULYSSES_CUDA_ARCH_NAMESPACE {
/// Closes what ULYSSES_CUDA_DETAIL_BEGIN opened.
#define ULYSSES_CUDA_DETAIL_END \
  }                             \
  }                             \
  ULYSSES_NAMESPACE_END

/// Attributes of every ulysses kernel: hidden visibility, so that shared libraries that each
/// instantiate a kernel do not interpose one another's (as CCCL does).
#if defined(__GNUC__) || defined(__clang__)
#define ULYSSES_KERNEL_ATTRIBUTES __global__ __attribute__((visibility("hidden")))
#else
#define ULYSSES_KERNEL_ATTRIBUTES __global__
#endif

/// `#pragma unroll` in device code (nothing in host code, where GCC would warn about it).
#if defined(__CUDA_ARCH__)
#define ULYSSES_UNROLL _Pragma("unroll")
#else
#define ULYSSES_UNROLL
#endif

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// Throws Error(backend) "<what>: <cudaGetErrorName>: <cudaGetErrorString>" unless e == cudaSuccess.
inline void cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(Errc::backend, std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

/// What a process can do with the CUDA it loaded (cuda_verdict()).
enum class CudaVerdict {
  ok,              ///< at least one device
  no_driver,       ///< no CUDA driver (cudaDriverGetVersion 0: no libcuda): no GPU here
  build_mismatch,  ///< a driver older than the build's runtime (cudaErrorInsufficientDriver with a driver): the build cannot run here
  no_device,       ///< a driver but no device (cudaErrorNoDevice, 0 devices, or another error of cudaGetDeviceCount)
};

/// Classifies cudaGetDeviceCount's answer with the versions (CUDA's encoding, 1000 * major + 10 *
/// minor: 13000 for 13.0): cudaErrorInsufficientDriver means "no device" only without a driver
/// (driver 0); with one, the driver is older than the runtime the binary carries: a build for a
/// newer CUDA than this machine runs, to be rebuilt, not a missing GPU. Host only, pure.
/// @param driver  cudaDriverGetVersion (0: no driver)
/// @param runtime cudaRuntimeGetVersion
/// @param count_error cudaGetDeviceCount's result; @param count its device count
inline CudaVerdict cuda_verdict(int driver, int runtime, cudaError_t count_error, int count) noexcept {
  if (count_error == cudaSuccess && count > 0) return CudaVerdict::ok;
  if (driver == 0) return CudaVerdict::no_driver;
  if (count_error == cudaErrorInsufficientDriver || (driver > 0 && driver < runtime)) return CudaVerdict::build_mismatch;
  return CudaVerdict::no_device;
}

/// The CUDA versions as "13.0" (CUDA's 1000 * major + 10 * minor encoding; 0: "none").
inline std::string cuda_version_string(int v) {
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

/// One line for people: the loaded runtime and driver, the device count, and what the verdict
/// means ("ok: 1 device(s)", "no CUDA driver: no GPU here", "build mismatch: ...", "no device: ...").
inline std::string cuda_report(int driver, int runtime, cudaError_t count_error, int count) {
  const std::string v = "CUDA runtime " + cuda_version_string(runtime) + " (this build's), driver " + cuda_version_string(driver) + ": ";
  switch (cuda_verdict(driver, runtime, count_error, count)) {
    case CudaVerdict::ok: return v + "ok: " + std::to_string(count) + " device(s)";
    case CudaVerdict::no_driver: return v + "no CUDA driver: no GPU here";
    case CudaVerdict::build_mismatch:
      return v + "build mismatch: the driver runs CUDA <= " + cuda_version_string(driver) + ", older than this build's runtime " +
             cuda_version_string(runtime) + " (" + cudaGetErrorName(count_error) + "): rebuild with a CUDA toolkit <= " +
             cuda_version_string(driver) + " (not a missing device)";
    case CudaVerdict::no_device: break;
  }
  return v + "no device (" + std::string(count_error == cudaSuccess ? "0 devices" : cudaGetErrorName(count_error)) + ")";
}

/// Before launching `kernel`: `pending` is cudaPeekAtLastError(). An error already pending on
/// this thread comes from an earlier call (someone else's launch, or a sticky error of the
/// context): Error(backend) names it as such, not as this launch's failure, and leaves it
/// pending for its owner (peek does not clear it); the caller then launches nothing. After the
/// launch, check_launch() reads the launch's own error.
/// @throws Error(backend) when `pending` is not cudaSuccess.
inline void check_pending(cudaError_t pending, const char* kernel) {
  if (pending == cudaSuccess) return;
  throw Error(Errc::backend, std::string(kernel) + " not launched: a CUDA error from an earlier call is pending on this thread (" +
                                 cudaGetErrorName(pending) + ": " + cudaGetErrorString(pending) +
                                 "; not this launch's: read and clear it with cudaGetLastError where it was made)");
}
/// Right after a launch of `kernel` that check_pending() preceded: cudaGetLastError() is this
/// launch's error. @throws Error(backend) the launch failed.
inline void check_launch(const char* kernel) { cuda_check(cudaGetLastError(), (std::string(kernel) + " launch").c_str()); }

}  // namespace detail
ULYSSES_NAMESPACE_END
