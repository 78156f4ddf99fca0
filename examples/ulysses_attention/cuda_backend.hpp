// SPDX-License-Identifier: Apache-2.0
// `--device cuda` of the attention demo: P virtual ranks on the current GPU (DeviceLocalGroup),
// whose redistributions run on the device (CudaExecutor: one launch for pack, one for unpack;
// cudaMemcpyAsync device-to-device for the exchange). Plain C++ interface, so main.cpp stays a
// C++ translation unit; the implementation is cuda_backend.cu (nvcc).
#pragma once

#include <ulysses/ulysses.hpp>

#include <functional>
#include <string>

namespace demo_cuda {

/// "" when a CUDA device can be used, else why not (cudaGetDeviceCount's answer).
std::string unavailable();

/// Name and SM count of the current device, for the report.
std::string device_name();

/// One virtual rank. Enough of a communicator for the demo's run_rank (size, rank) plus the
/// one operation the demo needs on the device.
class Rank {
 public:
  struct Impl;
  explicit Rank(Impl* impl) : impl_(impl) {}
  int size() const;  ///< P
  int rank() const;  ///< this rank
  /// The path redistribute() takes for `plan` (choose_path of DeviceLocalGroup::Comm and CudaExecutor).
  ulysses::Path path(const ulysses::Plan& plan) const;

  /// Copies the host tensors `in` (the plan's input layouts) to the device, runs pack →
  /// exchange → unpack there, and copies the outputs back into the host tensors `out`.
  /// ms[0..2] += the device time of pack, exchange, unpack on this rank's stream (CUDA events;
  /// the exchange includes waiting for the peers' packs). Collective: all ranks call it.
  /// @throws ulysses::Error as ulysses::redistribute, Error(backend) for CUDA failures.
  void redistribute(const ulysses::Plan& plan, ulysses::Direction dir, const ulysses::TensorList<ulysses::ConstByteSpan>& in,
                    const ulysses::TensorList<ulysses::ByteSpan>& out, double ms[3]);

 private:
  Impl* impl_;
};

/// Runs fn(Rank&) on P threads, one virtual rank each, on the current device, and joins them;
/// the first rank's error is rethrown (as LocalGroup::spawn).
void run_group(int P, const std::function<void(Rank&)>& fn);

}  // namespace demo_cuda
