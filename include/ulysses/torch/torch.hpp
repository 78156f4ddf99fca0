// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief libtorch client (target ulysses::torch): a communicator over a c10d::ProcessGroup,
///        at::Tensor entry points, and autograd functions whose backward is the right adjoint.
///
/// The umbrella of the client: the core (ulysses.hpp), torch/comm.hpp (ProcessGroupComm, CPU
/// tensors), torch/tensor.hpp (specs from tensors, redistribute() of tensor lists) and
/// torch/autograd.hpp (SeqToHead / HeadToSeq). docs/torch.md; docs/headers.md, "torch/torch.hpp".
/// Requires libtorch (Debian: libtorch-dev, libgloo-dev).
#pragma once

#include "../ulysses.hpp"
#include "comm.hpp"
#include "tensor.hpp"
#include "autograd.hpp"
