// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief window_bytes_per_rank(): the one size every rank passes to a window (MpiWindow,
///        MpiDeviceWindow, NcclWindow) so that each rank's registrations of its own plan fit,
///        with every buffer aligned and room for staged inputs: the max over ranks an engine
///        otherwise computes by building every rank's plan by hand. docs/guide.md, "One copy
///        between the MPI processes of a node".
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "../error.hpp"
#include "plan.hpp"

ULYSSES_NAMESPACE_BEGIN

/// The alignment of every window registration and staged input, in bytes (MpiWindow::kAlignment,
/// MpiDeviceWindow::kAlignment and NcclWindow::kAlignment are this value).
inline constexpr std::size_t kWindowAlignment = 256;

/// Which buffers of a call the engine allocate()s from the window, in tensor order.
enum class WindowHolds : int {
  inputs,              ///< the call's inputs (their outputs elsewhere): the ranks pull
  outputs,             ///< the call's outputs (inputs elsewhere): seq→head pushes
  inputs_and_outputs,  ///< both, inputs first then outputs
};

/// What window_bytes_per_rank() sizes for.
struct WindowUse {
  Direction direction = Direction::seq_to_head;  ///< the call whose buffers the slot holds
  WindowHolds holds = WindowHolds::inputs_and_outputs;
  /// Room for the inputs that lie outside the window (WindowHolds::outputs) to be staged into it,
  /// where their peers cannot read them in place (no Cross Memory Attach).
  bool staging_room = true;
};

/// The bytes one rank's slot needs for `plan`: each buffer that `use` holds rounded up to
/// `alignment` (kWindowAlignment for the shipped windows), in allocate() order, plus the staging
/// room of `use`. Pure; no communication.
/// @param plan      a rank's plan
/// @param use       which buffers the slot holds
/// @param alignment of every registration (a power of two)
/// @throws Error(misaligned) alignment is not a power of two.
inline std::size_t window_bytes(const Plan& plan, WindowUse use = {}, std::size_t alignment = kWindowAlignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    detail::fail(Errc::misaligned, "window_bytes: alignment " + std::to_string(alignment) + " is not a power of two");
  const auto up = [&](std::size_t n) { return (n + alignment - 1) / alignment * alignment; };
  const bool in = use.holds != WindowHolds::outputs, out = use.holds != WindowHolds::inputs;
  std::size_t total = 0;
  for (int t = 0; t < plan.num_tensors(); ++t) {
    if (in || use.staging_room) total += up(plan.input_bytes(use.direction, t));
    if (out) total += up(plan.output_bytes(use.direction, t));
  }
  return total;
}

/// The `bytes_per_rank` every rank passes to the window: the largest window_bytes() over the P
/// ranks' plans (uneven splits give ranks different sizes; the window needs one). Builds each
/// rank's plan with `plan_of_rank`, so call it once, outside the training step.
/// @param P            the group's degree
/// @param plan_of_rank callable as Plan(int rank): rank r's plan (the same specs every rank uses)
/// @param use          which buffers the slot holds
/// @param alignment    of every registration
/// @throws what plan_of_rank throws; Error(invalid_group) P < 1; as window_bytes().
template <class PlanOfRank>
std::size_t window_bytes_per_rank(int P, PlanOfRank&& plan_of_rank, WindowUse use = {}, std::size_t alignment = kWindowAlignment) {
  if (P < 1) detail::fail(Errc::invalid_group, "window_bytes_per_rank: P=" + std::to_string(P) + " must be >= 1");
  std::size_t most = 0;
  for (int r = 0; r < P; ++r) most = std::max(most, window_bytes(plan_of_rank(r), use, alignment));
  return most;
}

ULYSSES_NAMESPACE_END
