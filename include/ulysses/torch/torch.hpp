// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief libtorch client (target ulysses::torch): a communicator over a c10d::ProcessGroup,
/// at::Tensor entry points, and autograd functions whose backward is the right adjoint.
///
/// The umbrella of the client: it includes the core (ulysses.hpp) and
/// - torch/comm.hpp: ProcessGroupComm, the communicator concept of transport.hpp over any
///   c10d::ProcessGroup whose backend moves CPU tensors (Gloo, MPI): all-to-all-v through
///   `alltoall_base` with byte split sizes, the agreement check's all-gather through `allgather`.
///   Host memory.
/// - torch/tensor.hpp: spec_of(), layout_from(), element_type_of_dtype(): an at::Tensor's dtype,
///   sizes and strides become a TensorSpec's element type and layouts (the tensors are [B, S, H, D]
///   in that logical order, any strides: bshd, a permuted bhsd view, a slice of a fused
///   projection...); redistribute() of at::Tensor lists: every tensor is checked against the plan
///   (device, dtype, layout kind, sizes, strides) before any rank enters the exchange:
///   Error(tensor_mismatch) or Error(layout_mismatch), naming the tensor.
/// - torch/autograd.hpp: SeqToHead / HeadToSeq, torch::autograd::Function wrappers
///   (seq_to_head_autograd(), head_to_seq_autograd()) whose backward is the adjoint:
///   seq_to_head_backward (summing the partial gradients of replicated kv heads) and
///   head_to_seq_backward.
///
/// Requires libtorch (CMake: find_package(Torch); Debian: libtorch-dev, and libgloo-dev for
/// ProcessGroupGloo). CPU tensors with the host executor; GPU tensors through a ProcessGroupNCCL
/// are not covered here (use NcclComm and CudaExecutor with the tensors' data pointers).
#pragma once

#include "../ulysses.hpp"
#include "comm.hpp"
#include "tensor.hpp"
#include "autograd.hpp"
