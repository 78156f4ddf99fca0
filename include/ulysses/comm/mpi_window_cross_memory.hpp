// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The MPI window's publishing policy: where each input of a call goes in the record of
///        its control block (in the slot, by offset; outside the window and read in place by
///        the peers with Cross Memory Attach, by pid and address; outside and unread; or staged
///        into the slot's free bytes), and every peer's record turned back into a PeerRecord (and
///        its CrossMemoryRecord) of this process's mapping. Why and when each: docs/guide.md
///        (One copy between the MPI processes of a node) and docs/design.md (transports).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cross_memory.hpp"
#include "mpi_window_arena.hpp"
#include "peer_record.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// What one call's publishing did (MpiWindowComm::staged_bytes(), remote_bytes()).
struct WindowPublished {
  std::size_t staged = 0;  ///< bytes staged into the slot
  std::size_t remote = 0;  ///< bytes the peers read in place (Cross Memory Attach)
};

/// How this rank publishes its inputs outside the window: `read_in_place` when the peers may
/// read them with Cross Memory Attach (the window's agreed probe, the communicator's setting and
/// the work's CrossMemoryRecord::reads_remote), for inputs whose peers read ranges of at least
/// `min_range` bytes on average (the cost is per range).
struct WindowPolicy {
  bool read_in_place = false;  ///< see the struct
  std::size_t min_range = 0;   ///< see the struct
};

/// Where staging starts in this rank's slot: after the registrations and after every input and
/// published output of this call that lies in the slot. @param n the inputs (<= kMaxTensors)
inline std::size_t window_staging_start(const MpiWindow& w, const PeerRecord& in, int n) {
  const std::byte* slot = w.at(w.rank());
  std::size_t cursor = w.used();
  for (int t = 0; t < n; ++t) {
    if (in.bytes[t] && w.contains(in.data[t], in.bytes[t])) cursor = std::max(cursor, static_cast<std::size_t>(in.data[t] - slot) + in.bytes[t]);
    if (in.outputs[t] && in.output_bytes[t] && w.contains(in.outputs[t], in.output_bytes[t]))
      cursor = std::max(cursor, static_cast<std::size_t>(in.outputs[t] - slot) + in.output_bytes[t]);
  }
  return cursor;
}

/// Clears the record's inputs and publishes the outputs that lie in the slot (offsets) and
/// every published output's size.
inline void window_publish_outputs(const MpiWindow& w, const PeerRecord& in, int n, WindowControl& c) {
  const std::byte* slot = w.at(w.rank());
  for (int t = 0; t < kMaxTensors; ++t) {
    c.offset[t] = WindowControl::kNone;
    c.bytes[t] = 0;
    c.address[t] = 0;
    const bool out = t < n && in.outputs[t] && in.output_bytes[t] && w.contains(in.outputs[t], in.output_bytes[t]);
    c.out_offset[t] = out ? static_cast<std::uint64_t>(in.outputs[t] - slot) : WindowControl::kNone;
    c.out_bytes[t] = t < n && in.outputs[t] ? in.output_bytes[t] : 0;
  }
}

/// Places input t in the record (see the file comment); stages it at `cursor` when it must.
/// Returns "" or why it cannot.
inline std::string window_place_input(MpiWindow& w, const PeerRecord& in, int t, const WindowPolicy& policy, std::size_t& cursor,
                                      WindowControl& c, WindowPublished& done) {
  const std::byte* p = in.data[t];
  const std::size_t b = in.bytes[t];
  const std::byte* slot = w.at(w.rank());
  const std::string who = "MpiWindowComm: input " + std::to_string(t) + " of rank " + std::to_string(w.rank());
  if (!b || !p) return {};
  c.bytes[t] = b;
  if (w.contains(p, b)) {
    c.offset[t] = static_cast<std::uint64_t>(p - slot);
    return {};
  }
  if (w.starts_in(p))
    return who + " starts in the window and runs " + std::to_string(b - static_cast<std::size_t>(slot + w.bytes_per_rank() - p)) +
           " bytes past its end";
  if (in.unread[t]) {  // no peer reads it (e.g. they have no tokens: C17): neither staged nor published, no room needed
    c.offset[t] = WindowControl::kOwn;
    return {};
  }
  if (policy.read_in_place && in.cross_memory->range_bytes[t] >= policy.min_range) {  // the peers read it where it is: one copy
    c.offset[t] = WindowControl::kRemote;
    c.address[t] = reinterpret_cast<std::uintptr_t>(p);
    done.remote += in.read_bytes[t] ? static_cast<std::size_t>(in.read_bytes[t]) : b;  // what the peers read (not a view's span)
    return {};
  }
  const std::size_t off = round_up(cursor, MpiWindow::kAlignment);
  if (off > w.bytes_per_rank() || b > w.bytes_per_rank() - off)
    return who + " (" + std::to_string(b) + " bytes) is outside the window, and the window has " +
           std::to_string(off > w.bytes_per_rank() ? 0 : w.bytes_per_rank() - off) +
           " free bytes to stage it in; allocate the inputs from the window (MpiWindow::allocate) or make it larger";
  std::memcpy(w.at(w.rank()) + off, p, b);
  c.offset[t] = off;
  done.staged += b;
  cursor = off + b;
  return {};
}

/// Publishes this rank's inputs and outputs in its record `c` (not the epochs: the caller
/// publishes the arrival after it). Returns "" or why it cannot (no input is staged after the
/// first refusal).
inline std::string window_publish(MpiWindow& w, const PeerRecord& in, const WindowPolicy& policy, WindowControl& c, WindowPublished& done) {
  done = WindowPublished{};
  std::string err;
  if (!w.guard_intact())
    err = "MpiWindowComm: rank " + std::to_string(w.rank()) + " wrote past the end of its window slot of " + std::to_string(w.bytes_per_rank()) +
          " bytes (the guard page after it changed): a buffer allocated from the window ran past its end; the window's contents can no "
          "longer be trusted (make a new MpiWindow, with room for every buffer)";
  const int n = std::min(std::max(in.count, 0), kMaxTensors);
  std::size_t cursor = window_staging_start(w, in, n);
  window_publish_outputs(w, in, n, c);
  for (int t = 0; t < n && err.empty(); ++t) err = window_place_input(w, in, t, policy, cursor, c, done);
  c.count = static_cast<std::uint64_t>(in.count);
  c.layouts = in.layouts;
  const CrossMemoryRecord none;
  const CrossMemoryRecord& x = in.cross_memory ? *in.cross_memory : none;
  c.reads_remote = x.reads_remote ? 1 : 0;
  c.list = x.list;
  c.list_blocks = x.list_blocks;
  c.table = x.table;
  c.registered = w.digest();
  return err;
}

/// Rank p's record `r` as work() gets it in this process (rank `me` loads its own inputs
/// outside the window where they are, `mine`): inputs and outputs in the window at this process's
/// mapping of p's slot; inputs read in place by pid and address (`x`, linked from `v` when p
/// publishes any, or when this rank may push to p). Returns whether every non-empty output of p
/// is storable here, and sets `published` when p published one.
inline bool window_view(const MpiWindow& w, int p, int me, const WindowControl& r, const PeerRecord& mine, PeerRecord& v, CrossMemoryRecord& x,
                        bool& published) {
  v = PeerRecord{};
  x = CrossMemoryRecord{};
  v.count = static_cast<int>(r.count);
  v.layouts = r.layouts;
  x.pid = p != me && w.cross_memory_attach() ? static_cast<std::int64_t>(r.pid) : 0;  // (its inputs may be remote, or it may be pushed to)
  x.list = r.list;
  x.list_blocks = r.list_blocks;
  x.table = r.table;
  bool outputs = true;
  for (int t = 0; t < kMaxTensors; ++t) {
    const bool used = t < v.count && r.offset[t] != WindowControl::kNone;
    const bool remote = used && r.offset[t] == WindowControl::kRemote;
    const bool owner_only = used && r.offset[t] == WindowControl::kOwn;  // read by its owner only
    v.data[t] = !used ? nullptr : !remote && !owner_only ? w.at(p) + r.offset[t] : p == me ? mine.data[t] : nullptr;  // own inputs: loaded here
    v.bytes[t] = used ? static_cast<std::size_t>(r.bytes[t]) : 0;
    x.remote[t] = remote ? r.address[t] : 0;
    if (remote && p != me) x.pid = static_cast<std::int64_t>(r.pid);
    const bool out = t < v.count && r.out_offset[t] != WindowControl::kNone;
    v.outputs[t] = out ? w.at(p) + r.out_offset[t] : nullptr;  // stored to by the pushed seq→head
    v.output_bytes[t] = t < v.count ? static_cast<std::size_t>(r.out_bytes[t]) : 0;
    outputs = outputs && (!v.output_bytes[t] || v.outputs[t]);
    published = published || v.output_bytes[t];
  }
  v.cross_memory = &x;
  return outputs;
}

}  // namespace detail
ULYSSES_NAMESPACE_END
