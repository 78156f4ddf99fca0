// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief ulysses::Error: the one exception type of the library, with a stable error code.
#pragma once

#include <stdexcept>
#include <string>

#include "version.hpp"

ULYSSES_NAMESPACE_BEGIN

/// Stable error codes. Tests and engines branch on the code, never on the message text.
enum class Errc : int {
  invalid_group = 1,         ///< group size < 1, or rank outside [0, size)
  invalid_shape,             ///< a global extent (B, S, H, Hkv, D, element size) is < 1
  size_overflow,             ///< a product of extents or a byte count overflows int64 / size_t
  seq_not_divisible,         ///< even sequence split asked for, S % P != 0
  seq_lengths_mismatch,      ///< explicit sequence lengths: wrong count, negative, or sum != S
  heads_not_divisible,       ///< even head split asked for, H % P != 0
  gqa_invalid,               ///< Hkv does not divide H, or a kv partition does not give a rank the kv heads its query heads use
  gqa_group_mismatch,        ///< even split: neither Hkv % P == 0 nor P % Hkv == 0
  invalid_partition,         ///< an explicit partition that does not tile [0, extent) or is not monotone
  layout_mismatch,           ///< a layout whose extents differ from the local shape the plan expects
  layout_aliasing,           ///< a layout whose strides map two elements to one address (or negative strides)
  workspace_too_small,       ///< the workspace passed is smaller than Plan::workspace_bytes()
  buffer_overlap,            ///< an output overlaps an input, another output or the workspace
  misaligned,                ///< a pointer is not aligned for its element size
  wrong_tensor_count,        ///< the number of tensors passed differs from the plan's
  comm_mismatch,             ///< the communicator's size or rank differs from the plan's group
  plan_mismatch,             ///< ranks built their plans from different inputs (cross-rank check)
  timeout,                   ///< a peer did not arrive at a collective within the communicator's timeout (every shipped communicator)
  aborted,                   ///< a peer failed and the collective was abandoned, or the communicator is broken by an earlier failure
  backend,                   ///< the communication or device backend reported an error (its message included)
  buffer_too_small,          ///< a tensor buffer holds fewer bytes than its layout spans (the message names the tensor)
  not_summable,              ///< replicated heads are to be summed, but the element type has no addition (opaque)
  not_adjoint,               ///< a backward call on a plan whose head→seq takes replicated heads from their owner
  path_unsupported,          ///< PlanOptions::path names a transport the communicator and executor cannot do
  tensor_mismatch,           ///< another element type: an at::Tensor (torch.hpp) of another dtype, undefined, on another device or not strided; a range of another element size
  invalid_mesh,              ///< a node layout or 2-D mesh whose degrees, node sizes or rank counts do not fit together
};

/// Name of an error code, e.g. "heads_not_divisible".
inline const char* to_string(Errc c) noexcept {
  switch (c) {
    case Errc::invalid_group: return "invalid_group";
    case Errc::invalid_shape: return "invalid_shape";
    case Errc::size_overflow: return "size_overflow";
    case Errc::seq_not_divisible: return "seq_not_divisible";
    case Errc::seq_lengths_mismatch: return "seq_lengths_mismatch";
    case Errc::heads_not_divisible: return "heads_not_divisible";
    case Errc::gqa_invalid: return "gqa_invalid";
    case Errc::gqa_group_mismatch: return "gqa_group_mismatch";
    case Errc::invalid_partition: return "invalid_partition";
    case Errc::layout_mismatch: return "layout_mismatch";
    case Errc::layout_aliasing: return "layout_aliasing";
    case Errc::workspace_too_small: return "workspace_too_small";
    case Errc::buffer_overlap: return "buffer_overlap";
    case Errc::misaligned: return "misaligned";
    case Errc::wrong_tensor_count: return "wrong_tensor_count";
    case Errc::comm_mismatch: return "comm_mismatch";
    case Errc::plan_mismatch: return "plan_mismatch";
    case Errc::timeout: return "timeout";
    case Errc::aborted: return "aborted";
    case Errc::backend: return "backend";
    case Errc::buffer_too_small: return "buffer_too_small";
    case Errc::not_summable: return "not_summable";
    case Errc::not_adjoint: return "not_adjoint";
    case Errc::path_unsupported: return "path_unsupported";
    case Errc::tensor_mismatch: return "tensor_mismatch";
    case Errc::invalid_mesh: return "invalid_mesh";
  }
  return "unknown";
}

/// The exception every ulysses function throws. `what()` is "ulysses: <code>: <message>", where
/// the message names the offending numbers and, for configuration errors, what to change.
class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message)
      : std::runtime_error(std::string("ulysses: ") + to_string(code) + ": " + message), code_(code) {}
  /// The stable error code.
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

namespace detail {
[[noreturn]] inline void fail(Errc code, const std::string& message) { throw Error(code, message); }
}  // namespace detail

ULYSSES_NAMESPACE_END
