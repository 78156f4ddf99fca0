// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief window_sizes(): what every rank allocate()s from a window (MpiWindow, MpiDeviceWindow,
///        NcclWindow) and the one bytes_per_rank every rank passes to it: per buffer the largest
///        any rank's plan needs, every buffer aligned, room for staged inputs. What an engine
///        otherwise computes by building every rank's plan by hand. docs/guide.md, "One copy
///        between the MPI processes of a node".
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

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

namespace detail {
/// The sizes of the buffers `use` holds for `plan`, in allocate() order (each tensor's input, then
/// each tensor's output), unaligned.
inline std::vector<std::size_t> window_buffers_of(const Plan& plan, const WindowUse& use) {
  std::vector<std::size_t> n;
  for (int t = 0; t < plan.num_tensors() && use.holds != WindowHolds::outputs; ++t) n.push_back(plan.input_bytes(use.direction, t));
  for (int t = 0; t < plan.num_tensors() && use.holds != WindowHolds::inputs; ++t) n.push_back(plan.output_bytes(use.direction, t));
  return n;
}
/// The staging room of `plan`'s inputs (each aligned) where `use` holds them outside the window.
inline std::size_t staging_room_of(const Plan& plan, const WindowUse& use, std::size_t alignment) {
  std::size_t n = 0;
  for (int t = 0; use.holds == WindowHolds::outputs && use.staging_room && t < plan.num_tensors(); ++t)
    n += (plan.input_bytes(use.direction, t) + alignment - 1) / alignment * alignment;
  return n;
}
inline void check_window_alignment(std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    fail(Errc::misaligned, "window sizes: alignment " + std::to_string(alignment) + " is not a power of two");
}
}  // namespace detail

/// What every rank of a group allocate()s from its window, and the window's size: the same sizes
/// in the same order on every rank (the windows compare the registrations), so each is the
/// largest size any rank's plan needs for that buffer.
struct WindowSizes {
  /// The buffers to allocate() on every rank, in order: each tensor's input of the call, then each
  /// tensor's output (as WindowUse::holds says), each the largest over the ranks' plans, in bytes.
  std::vector<std::size_t> buffers;
  /// The `bytes_per_rank` to pass to the window: the buffers, each rounded up to the alignment,
  /// plus the staging room (the largest rank's inputs, each aligned) when WindowUse asks for it.
  std::size_t bytes_per_rank = 0;
};

/// The window sizes of a group of P ranks (see WindowSizes). Builds each rank's plan with
/// `plan_of_rank`, so call it once, outside the training step. Pure; no communication.
/// @param P            the group's degree
/// @param plan_of_rank callable as Plan(int rank): rank r's plan (the same specs every rank uses)
/// @param use          which buffers the slot holds
/// @param alignment    of every registration (kWindowAlignment for the shipped windows; a power of two)
/// @throws Error(invalid_group) P < 1, or a plan of another degree or rank than asked for;
///         Error(plan_mismatch) the plans hold different numbers of tensors; Error(misaligned)
///         alignment is not a power of two; what plan_of_rank throws.
template <class PlanOfRank>
WindowSizes window_sizes(int P, PlanOfRank&& plan_of_rank, WindowUse use = {}, std::size_t alignment = kWindowAlignment) {
  if (P < 1) detail::fail(Errc::invalid_group, "window_sizes: P=" + std::to_string(P) + " must be >= 1");
  detail::check_window_alignment(alignment);
  WindowSizes w;
  std::size_t staging = 0;
  for (int r = 0; r < P; ++r) {
    const Plan& plan = plan_of_rank(r);
    if (plan.degree() != P || plan.rank() != r)
      detail::fail(Errc::invalid_group, "window_sizes: plan_of_rank(" + std::to_string(r) + ") made a plan for rank " +
                                            std::to_string(plan.rank()) + " of P=" + std::to_string(plan.degree()));
    const std::vector<std::size_t> mine = detail::window_buffers_of(plan, use);
    if (r > 0 && mine.size() != w.buffers.size())
      detail::fail(Errc::plan_mismatch, "window_sizes: rank " + std::to_string(r) + "'s plan holds another number of tensors than rank 0's");
    w.buffers.resize(mine.size(), 0);
    for (std::size_t i = 0; i < mine.size(); ++i) w.buffers[i] = std::max(w.buffers[i], mine[i]);
    staging = std::max(staging, detail::staging_room_of(plan, use, alignment));
  }
  for (std::size_t n : w.buffers) w.bytes_per_rank += (n + alignment - 1) / alignment * alignment;
  w.bytes_per_rank += staging;
  return w;
}

/// window_sizes(P, plan_of_rank, use, alignment).bytes_per_rank: the size every rank passes to the
/// window. @throws as window_sizes().
template <class PlanOfRank>
std::size_t window_bytes_per_rank(int P, PlanOfRank&& plan_of_rank, WindowUse use = {}, std::size_t alignment = kWindowAlignment) {
  return window_sizes(P, plan_of_rank, use, alignment).bytes_per_rank;
}

ULYSSES_NAMESPACE_END
